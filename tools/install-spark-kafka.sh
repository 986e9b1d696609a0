#!/bin/sh
# Resolve Spark's Kafka source (org.apache.spark:spark-sql-kafka-0-10_2.13, version in tools/spark-kafka/pom.xml)
# and its runtime dependencies from Maven Central into a cache outside the repository:
#   ${KCG_SPARK_KAFKA_CACHE:-${XDG_CACHE_HOME:-~/.cache}/kcg-spark-kafka}/<version>/lib
# for bench/sink_peers.py, which hands the jars to its Spark session as spark.jars (local paths: no --packages
# download at run time). The directory is stamped with the SHA-256 of the pom: a later run with the same pom does
# nothing. Prints the lib directory on stdout; fails (exit 1) with a message if Maven or Java is missing or Maven
# cannot resolve the artifacts (Maven Central unreachable, or the version not served).
# KCG_SPARK_KAFKA_VERSION overrides the pom's version (another PySpark, or a version Central does not serve yet).
# Usage: tools/install-spark-kafka.sh
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
pom="$root/tools/spark-kafka/pom.xml"
version=${KCG_SPARK_KAFKA_VERSION:-$(sed -n 's:.*<spark.version>\(.*\)</spark.version>.*:\1:p' "$pom")}
if [ -z "$version" ]; then
    echo "install-spark-kafka: no <spark.version> in $pom" >&2
    exit 1
fi
cache="${KCG_SPARK_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kcg-spark-kafka}"
dir="$cache/$version"
hash=$( (cat "$pom"; echo "$version") | sha256sum | cut -c1-64)
jar="spark-sql-kafka-0-10_2.13-$version.jar"
if [ -f "$dir/stamp" ] && [ "$(cat "$dir/stamp")" = "$hash" ] && [ -f "$dir/lib/$jar" ]; then
    echo "$dir/lib"
    exit 0
fi
for tool in mvn java; do
    if ! command -v "$tool" > /dev/null 2>&1; then
        echo "install-spark-kafka: '$tool' is not installed; Spark's Kafka source $version needs a JDK 17+ and" \
             "Maven (Debian: openjdk-17-jdk-headless maven)" >&2
        exit 1
    fi
done
mkdir -p "$dir"
tmp="$dir/lib.partial"
rm -rf "$tmp"
echo "install-spark-kafka: resolving org.apache.spark:spark-sql-kafka-0-10_2.13:$version from Maven Central" \
     "into $dir/lib" >&2
if ! mvn -B -U -q -Dstyle.color=never -f "$pom" -Dspark.version="$version" -Dkcg.build.dir="$dir/build" \
        dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" > "$dir/mvn.log" 2>&1 \
        || [ ! -f "$tmp/$jar" ]; then
    echo "install-spark-kafka: Maven could not resolve org.apache.spark:spark-sql-kafka-0-10_2.13:$version and" \
         "its dependencies (Maven Central unreachable, or the version is not served?). Last lines of $dir/mvn.log:" >&2
    esc=$(printf '\033')
    tail -n 20 "$dir/mvn.log" | sed "s/${esc}\[[0-9;]*m//g" >&2
    exit 1
fi
rm -rf "$dir/lib"
mv "$tmp" "$dir/lib"
echo "$hash" > "$dir/stamp"
echo "install-spark-kafka: $(ls "$dir/lib" | wc -l) jars in $dir/lib" >&2
echo "$dir/lib"
