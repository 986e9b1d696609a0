#!/bin/sh
# Install the Strimzi Kafka Bridge (io.strimzi:kafka-bridge, version in tools/strimzi/pom.xml), the HTTP peer of
# bench/peers.py, into a cache outside the repository:
#   ${KCG_STRIMZI_CACHE:-${XDG_CACHE_HOME:-~/.cache}/kcg-strimzi}/<version>/lib
# 1. From Maven Central: `mvn dependency:copy-dependencies` on tools/strimzi/pom.xml (the bridge jar and its runtime
#    dependencies).
# 2. If Maven Central does not serve that version (the Central these machines reach did not, for 0.32.0 to 1.1.0),
#    and KCG_STRIMZI_SRC names a source tree of the bridge at that version (git clone --branch <version>
#    https://github.com/strimzi/strimzi-kafka-bridge), it is copied into the cache and compiled there with Maven
#    (dependencies from Maven Central; no tests, no checkstyle/spotbugs) into the same lib directory.
# Otherwise it fails (exit 1) saying what happened. The directory is stamped with the SHA-256 of the pom: a later
# run with the same pom does nothing. `origin` in the version directory says how the bridge got there.
# The bridge needs Java 21+: KCG_STRIMZI_JAVA_HOME (default: the first Temurin 21+ JDK in /usr/lib/jvm, else
# JAVA_HOME). Prints the lib directory on stdout.
# Usage: [KCG_STRIMZI_SRC=<bridge source tree>] tools/install-strimzi.sh
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
pom="$root/tools/strimzi/pom.xml"
version=$(sed -n 's:.*<strimzi.bridge.version>\(.*\)</strimzi.bridge.version>.*:\1:p' "$pom")
if [ -z "$version" ]; then
    echo "install-strimzi: no <strimzi.bridge.version> in $pom" >&2
    exit 1
fi
cache="${KCG_STRIMZI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kcg-strimzi}"
dir="$cache/$version"
hash=$(sha256sum "$pom" | cut -c1-64)
jar="kafka-bridge-$version.jar"
if [ -f "$dir/stamp" ] && [ "$(cat "$dir/stamp")" = "$hash" ] && [ -f "$dir/lib/$jar" ]; then
    echo "$dir/lib"
    exit 0
fi
if ! command -v mvn > /dev/null 2>&1; then
    echo "install-strimzi: Maven is not installed (Debian: maven)" >&2
    exit 1
fi
jhome="${KCG_STRIMZI_JAVA_HOME:-}"
if [ -z "$jhome" ]; then
    for d in /usr/lib/jvm/temurin-2[1-9]* /usr/lib/jvm/java-2[1-9]*; do
        if [ -x "$d/bin/javac" ]; then jhome="$d"; break; fi
    done
fi
jhome="${jhome:-${JAVA_HOME:-}}"
mkdir -p "$dir"
tmp="$dir/lib.partial"
rm -rf "$tmp"
strip() { esc=$(printf '\033'); tail -n "$1" "$2" | sed "s/${esc}\[[0-9;]*m//g" >&2; }
echo "install-strimzi: resolving io.strimzi:kafka-bridge:$version from Maven Central into $dir/lib" >&2
if mvn -B -U -q -Dstyle.color=never -f "$pom" -Dkcg.build.dir="$dir/build" dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$tmp" > "$dir/mvn.log" 2>&1 && [ -f "$tmp/$jar" ]; then
    echo "maven-central io.strimzi:kafka-bridge:$version" > "$dir/origin"
elif [ -n "${KCG_STRIMZI_SRC:-}" ]; then
    echo "install-strimzi: Maven Central did not serve io.strimzi:kafka-bridge:$version ($(grep -m1 -o 'Could not find artifact [^ ]*' "$dir/mvn.log" || echo 'see mvn.log'));" \
         "building it from $KCG_STRIMZI_SRC" >&2
    src_version=$(sed -n '0,/<version>/s:.*<version>\(.*\)</version>.*:\1:p' "$KCG_STRIMZI_SRC/pom.xml")
    if [ "$src_version" != "$version" ]; then
        echo "install-strimzi: $KCG_STRIMZI_SRC/pom.xml is version '$src_version', not $version" >&2
        exit 1
    fi
    if [ -z "$jhome" ] || [ ! -x "$jhome/bin/javac" ]; then
        echo "install-strimzi: the bridge needs a JDK 21+ to build (set KCG_STRIMZI_JAVA_HOME)" >&2
        exit 1
    fi
    rm -rf "$dir/src"
    cp -r "$KCG_STRIMZI_SRC" "$dir/src"
    rm -rf "$dir/src/target"
    # compile + jar + runtime dependencies only. Maven resolves the test-scoped dependencies too: the
    # KCG_STRIMZI_BUILD_ARGS default replaces the version of the bridge's test-only Vert.x modules (1.0.0 names
    # vertx-opentelemetry 5.0.10, which the Maven Central reached here does not serve); nothing test-scoped is
    # copied into lib.
    # shellcheck disable=SC2086
    if ! JAVA_HOME="$jhome" PATH="$jhome/bin:$PATH" mvn -B -U -Dstyle.color=never -f "$dir/src/pom.xml" \
            -Dcheckstyle.skip -Dspotbugs.skip -Dmdep.analyze.skip ${KCG_STRIMZI_BUILD_ARGS:--Dvertx-testing.version=5.0.8} \
            compile jar:jar dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" \
            > "$dir/build.log" 2>&1 || [ ! -f "$dir/src/target/$jar" ]; then
        echo "install-strimzi: building the bridge failed. Last lines of $dir/build.log:" >&2
        strip 20 "$dir/build.log"
        exit 1
    fi
    cp "$dir/src/target/$jar" "$tmp/"
    echo "source build of io.strimzi:kafka-bridge:$version (dependencies from Maven Central)" > "$dir/origin"
else
    echo "install-strimzi: Maven could not resolve io.strimzi:kafka-bridge:$version (not served by the Maven Central" \
         "reached here?); set KCG_STRIMZI_SRC to a source tree of the bridge at $version to build it. Last lines of" \
         "$dir/mvn.log:" >&2
    strip 20 "$dir/mvn.log"
    exit 1
fi
rm -rf "$dir/lib"
mv "$tmp" "$dir/lib"
echo "$hash" > "$dir/stamp"
echo "install-strimzi: $(ls "$dir/lib" | wc -l) jars in $dir/lib ($(cat "$dir/origin"))" >&2
echo "$dir/lib"
