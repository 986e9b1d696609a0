// Take N records of a topic through a share group with W Java share consumers (KafkaShareConsumer, kafka-clients),
// each on its own thread, in explicit acknowledgement mode: poll, acknowledge every record (accept), poll again
// (the acknowledgements ride on that poll); when N distinct records were acknowledged, each consumer commits
// (commitSync) and closes. Prints one JSON line: records, distinct records, seconds from before the consumers were
// created to the first record and to the end (every consumer's commitSync answered), polls, and the settings.
// bench/share.py compiles this file with javac into a cache directory (classpath: the Kafka lib directory of
// tools/install-kafka.sh) and runs it.
//
// Usage: java -cp <cache>:<kafka lib>/* ShareConsumeN <bootstrap> <topic> <group> <n> <workers> [key=value ...]
// The group's share.auto.offset.reset is set to earliest first (an Admin client); key=value pairs add or override
// consumer properties.

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.config.ConfigResource;

public final class ShareConsumeN {
    private ShareConsumeN() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 5) {
            System.err.println("usage: ShareConsumeN <bootstrap> <topic> <group> <n> <workers> [key=value ...]");
            System.exit(2);
        }
        String bootstrap = args[0];
        String topic = args[1];
        String group = args[2];
        long n = Long.parseLong(args[3]);
        int workers = Integer.parseInt(args[4]);
        TreeMap<String, String> settings = new TreeMap<>();
        settings.put("share.acknowledgement.mode", "explicit");
        for (int i = 5; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            settings.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        Properties adminProps = new Properties();
        adminProps.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(adminProps)) {
            ConfigResource res = new ConfigResource(ConfigResource.Type.GROUP, group);
            AlterConfigOp op = new AlterConfigOp(new ConfigEntry("share.auto.offset.reset", "earliest"),
                    AlterConfigOp.OpType.SET);
            admin.incrementalAlterConfigs(Map.of(res, List.of(op))).all().get();
        }
        Properties props = new Properties();
        props.putAll(settings);
        props.put("bootstrap.servers", bootstrap);
        props.put("group.id", group);
        props.put("key.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        props.put("value.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        Set<Long> seen = ConcurrentHashMap.newKeySet();
        AtomicLong acked = new AtomicLong();
        AtomicLong polls = new AtomicLong();
        AtomicLong first = new AtomicLong();
        long t0 = System.nanoTime();
        long deadline = t0 + 300_000_000_000L;
        Thread[] threads = new Thread[workers];
        Throwable[] failed = new Throwable[1];
        for (int w = 0; w < workers; w++) {
            threads[w] = new Thread(() -> {
                try (KafkaShareConsumer<byte[], byte[]> consumer = new KafkaShareConsumer<>(props)) {
                    consumer.subscribe(List.of(topic));
                    while (seen.size() < n && System.nanoTime() < deadline) {
                        ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(200));
                        polls.incrementAndGet();
                        for (ConsumerRecord<byte[], byte[]> r : records) {
                            first.compareAndSet(0, System.nanoTime());
                            consumer.acknowledge(r);
                            acked.incrementAndGet();
                            seen.add(((long) r.partition() << 48) | r.offset());
                        }
                    }
                    consumer.commitSync();
                } catch (Throwable e) {
                    synchronized (failed) {
                        failed[0] = e;
                    }
                }
            });
            threads[w].start();
        }
        for (Thread t : threads) {
            t.join();
        }
        long end = System.nanoTime();
        if (failed[0] != null) {
            failed[0].printStackTrace();
            System.exit(1);
        }
        StringBuilder s = new StringBuilder();
        for (Map.Entry<String, String> e : settings.entrySet()) {
            s.append(s.length() == 0 ? "" : ", ").append(e.getKey()).append('=').append(e.getValue());
        }
        System.out.printf("{\"records\": %d, \"distinct\": %d, \"first_s\": %.6f, \"total_s\": %.6f, \"polls\": %d,"
                + " \"settings\": \"%s\"}%n", acked.get(), seen.size(), (first.get() - t0) / 1e9, (end - t0) / 1e9,
                polls.get(), s);
    }
}
