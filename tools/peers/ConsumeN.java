// Read N records of a topic from the beginning with the Java KafkaConsumer (kafka-clients), all partitions assigned
// (no group, no commits), and print one JSON line: records, seconds to the first and to the N-th record (from
// before the consumer was created), the rate after the first records, polls, and the settings used. bench/peers.py compiles this file with javac into
// a cache directory (classpath: the Kafka lib directory of tools/install-kafka.sh) and runs it.
//
// Usage: java -cp <cache>:<kafka lib>/* ConsumeN <bootstrap> <topic> <partitions> <n> [key=value ...]
// The key=value pairs override or add consumer properties.

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.TreeMap;

import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;

public final class ConsumeN {
    private ConsumeN() {
    }

    public static void main(String[] args) {
        if (args.length < 4) {
            System.err.println("usage: ConsumeN <bootstrap> <topic> <partitions> <n> [key=value ...]");
            System.exit(2);
        }
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        long n = Long.parseLong(args[3]);
        TreeMap<String, String> settings = new TreeMap<>();
        // tuned for a bulk read of small records: bigger fetches and polls than the defaults
        // (fetch.max.bytes 50 MiB is the default; max.partition.fetch.bytes 1 MiB, max.poll.records 500)
        settings.put("fetch.max.bytes", "52428800");
        settings.put("max.partition.fetch.bytes", "4194304");
        settings.put("max.poll.records", "10000");
        settings.put("receive.buffer.bytes", "1048576");
        for (int i = 4; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            settings.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        Properties props = new Properties();
        props.putAll(settings);
        props.put("bootstrap.servers", args[0]);
        props.put("enable.auto.commit", "false");
        props.put("key.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        props.put("value.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        long t0 = System.nanoTime();
        long got = 0;
        long bytes = 0;
        long polls = 0;
        long first = 0;
        long firstBatch = 0;
        long last = 0;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int p = 0; p < partitions; p++) {
                tps.add(new TopicPartition(topic, p));
            }
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            long deadline = t0 + 300_000_000_000L;
            while (got < n && System.nanoTime() < deadline) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(1000));
                polls++;
                int k = records.count();
                if (k > 0) {
                    for (var r : records) {
                        bytes += r.value() == null ? 0 : r.value().length;
                    }
                    if (got == 0) {
                        first = System.nanoTime();
                        firstBatch = k;
                    }
                    got += k;
                    last = System.nanoTime();
                }
            }
        }
        StringBuilder s = new StringBuilder();
        for (var e : settings.entrySet()) {
            s.append(s.length() == 0 ? "" : ", ").append(e.getKey()).append('=').append(e.getValue());
        }
        // the rate after the first poll that returned records (start-up, metadata and the first fetch excluded)
        double steady = last > first ? (got - firstBatch) / ((last - first) / 1e9) : 0.0;
        System.out.printf("{\"records\": %d, \"bytes\": %d, \"polls\": %d, \"first_s\": %.6f, \"total_s\": %.6f,"
                + " \"steady_rate\": %.1f, \"settings\": \"%s\"}%n", got, bytes, polls, (first - t0) / 1e9,
                (last - t0) / 1e9, steady, s);
    }
}
