#!/bin/sh
# Resolve Apache Kafka's broker (org.apache.kafka:kafka_2.13, version in tools/kafka/pom.xml) and its runtime
# dependencies, plus the slf4j binding it needs, from Maven Central into a cache outside the repository:
#   ${KCG_KAFKA_CACHE:-${XDG_CACHE_HOME:-~/.cache}/kcg-kafka}/<version>/lib
# The directory is stamped with the SHA-256 of the pom: a later run with the same pom does nothing (~10 ms), a
# changed pom (another version, another binding) resolves again. The embedded Kafka launcher
# (service/embedded/kafka.py) looks in the same place. Prints the lib directory on stdout.
# If Maven or Java is missing, or Maven cannot resolve the artifacts, it fails (exit 1) with a message saying so:
# the Kafka tests must never be skipped silently.
# Usage: tools/install-kafka.sh
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
pom="${KCG_KAFKA_POM:-$root/tools/kafka/pom.xml}"  # KCG_KAFKA_POM: another pom (the tests use it)
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")
if [ -z "$version" ]; then
    echo "install-kafka: no <kafka.version> in $pom" >&2
    exit 1
fi
cache="${KCG_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kcg-kafka}"
dir="$cache/$version"
hash=$(sha256sum "$pom" | cut -c1-64)
jar="kafka_2.13-$version.jar"
if [ -f "$dir/stamp" ] && [ "$(cat "$dir/stamp")" = "$hash" ] && [ -f "$dir/lib/$jar" ]; then
    echo "$dir/lib"
    exit 0
fi
for tool in mvn java; do
    if ! command -v "$tool" > /dev/null 2>&1; then
        echo "install-kafka: '$tool' is not installed; Apache Kafka $version (for the Kafka tests and" \
             "GATEWAY_EMBEDDED_BROKER=kafka) needs a JDK 17+ and Maven (Debian: openjdk-17-jdk-headless maven)" >&2
        exit 1
    fi
done
mkdir -p "$dir"
tmp="$dir/lib.partial"
rm -rf "$tmp"
echo "install-kafka: resolving org.apache.kafka:kafka_2.13:$version from Maven Central into $dir/lib" >&2
# -B: no progress bars in the log; -U: a failure Maven remembers (a network error) is retried, not replayed;
# the build directory goes to the cache, not the repository
if ! mvn -B -U -q -Dstyle.color=never -f "$pom" -Dkcg.build.dir="$dir/build" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$tmp" > "$dir/mvn.log" 2>&1 || [ ! -f "$tmp/$jar" ]; then
    echo "install-kafka: Maven could not resolve org.apache.kafka:kafka_2.13:$version and its dependencies" \
         "(Maven Central unreachable, or the version is not served?). Last lines of $dir/mvn.log:" >&2
    esc=$(printf '\033')
    tail -n 20 "$dir/mvn.log" | sed "s/${esc}\[[0-9;]*m//g" >&2
    exit 1
fi
rm -rf "$dir/lib"
mv "$tmp" "$dir/lib"
echo "$hash" > "$dir/stamp"
echo "install-kafka: $(ls "$dir/lib" | wc -l) jars in $dir/lib" >&2
echo "$dir/lib"
