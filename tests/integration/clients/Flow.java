// The consumer flow through the Java client that openapi-generator's `java` generator (okhttp-gson) makes from
// openapi.yaml (unmodified; tests/integration/test_generated_clients.py compiles this file with Maven beside it):
// produce (binary and json records) -> for a binary and a json instance: create -> subscribe -> poll -> commit -> committed offsets
// (query parameters, none) -> delete. Prints one JSON object with what it saw; exits non-zero on any error.
// Usage: java Flow <gateway URL> <API key> <topic> <group prefix> <records>
import com.google.gson.Gson;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import kcg.client.ApiClient;
import kcg.client.ApiException;
import kcg.client.api.ConsumersApi;
import kcg.client.api.ProduceApi;
import kcg.client.model.AutoCommitEnable;
import kcg.client.model.CommitOffset;
import kcg.client.model.CommitOffsets;
import kcg.client.model.CommittedOffset;
import kcg.client.model.CommittedOffsets;
import kcg.client.model.ConsumerRecord;
import kcg.client.model.CreateConsumer;
import kcg.client.model.JsonProduceRecord;
import kcg.client.model.JsonProduceRequest;
import kcg.client.model.ProducedOffset;
import kcg.client.model.Subscription;

public final class Flow {
    private static final Gson GSON = new Gson();

    private static byte[] utf8(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    private static Object unb64(Object data) {
        return GSON.fromJson(new String(Base64.getDecoder().decode((String) data), StandardCharsets.UTF_8), Object.class);
    }

    private static Map<String, Long> committed(List<CommittedOffset> offsets) {
        Map<String, Long> out = new TreeMap<>();
        for (CommittedOffset o : offsets) out.put(String.valueOf(o.getPartition()), o.getOffset());
        return out;
    }

    public static void main(String[] args) throws Exception {
        String base = args[0], apiKey = args[1], topic = args[2], prefix = args[3];
        int n = Integer.parseInt(args[4]);
        ApiClient client = new ApiClient();
        client.setBasePath(base);
        client.setBearerToken(apiKey);
        ConsumersApi consumers = new ConsumersApi(client);
        try {
            // the first half as binary records (base64, the format named by the contentType parameter), the rest
            // as json records (the body's default media type): one body type, JsonProduceRequest, carries both
            int half = n / 2;
            JsonProduceRequest binary = new JsonProduceRequest(), json = new JsonProduceRequest();
            Base64.Encoder b64 = Base64.getEncoder();
            for (int i = 0; i < half; i++) {
                binary.addRecordsItem(new JsonProduceRecord().key(b64.encodeToString(utf8(GSON.toJson("k" + i))))
                        .value(b64.encodeToString(utf8("{\"n\": " + i + "}"))));
            }
            for (int i = half; i < n; i++) {
                json.addRecordsItem(new JsonProduceRecord().key("k" + i).value(Collections.singletonMap("n", i)));
            }
            ProduceApi producer = new ProduceApi(client);
            List<ProducedOffset> answers = new ArrayList<>(
                    producer.produceToTopic(topic, binary, "application/vnd.kafka.binary.v2+json").getOffsets());
            answers.addAll(producer.produceToTopic(topic, json, null).getOffsets());
            List<Long> produced = new ArrayList<>();
            for (ProducedOffset o : answers) {
                if (o.getErrorCode() != null) throw new IllegalStateException("produce failed: " + o.getError());
                produced.add(o.getOffset());
            }
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("produced", produced);
            for (String format : new String[] {"binary", "json"}) {
                String group = prefix + "-" + format;
                CreateConsumer create = new CreateConsumer().name("java-" + format)
                        .format(CreateConsumer.FormatEnum.fromValue(format))
                        .autoOffsetReset(CreateConsumer.AutoOffsetResetEnum.fromValue("earliest"))
                        .autoCommitEnable(new AutoCommitEnable("false"));
                String iid = consumers.createConsumer(group, create).getInstanceId();
                consumers.subscribe(group, iid, new Subscription().topics(Collections.singletonList(topic)));
                List<String> subscription = consumers.getSubscription(group, iid).getTopics();
                List<ConsumerRecord> records = new ArrayList<>();
                long deadline = System.nanoTime() + 60_000_000_000L;
                while (records.size() < n && System.nanoTime() < deadline) {
                    records.addAll(consumers.getRecords(group, iid, 1000, null, null, null));
                }
                List<Object> values = new ArrayList<>(), keys = new ArrayList<>();
                Map<Integer, Long> last = new TreeMap<>();
                for (ConsumerRecord r : records) {
                    values.add(format.equals("binary") ? unb64(r.getValue()) : r.getValue());
                    keys.add(format.equals("binary") ? unb64(r.getKey()) : r.getKey());
                    last.merge(r.getPartition(), r.getOffset(), Math::max);
                }
                // the binary instance names the last offset of each partition, the json one commits all it got
                CommitOffsets commit = null;
                if (format.equals("binary")) {
                    commit = new CommitOffsets();
                    for (Map.Entry<Integer, Long> e : last.entrySet()) {
                        commit.addOffsetsItem(new CommitOffset().topic(topic).partition(e.getKey()).offset(e.getValue()));
                    }
                }
                List<Object> commitAnswer = consumers.commitOffsets(group, iid, commit);
                List<Integer> parts = new ArrayList<>(last.keySet());
                CommittedOffsets byQuery = consumers.getCommittedOffsets(group, iid, Collections.nCopies(parts.size(), topic), parts, null);
                CommittedOffsets assigned = consumers.getCommittedOffsets(group, iid, null, null, null);
                consumers.deleteConsumer(group, iid);
                Map<String, Long> lastOut = new TreeMap<>();
                last.forEach((p, o) -> lastOut.put(String.valueOf(p), o));
                Map<String, Object> seen = new LinkedHashMap<>();
                seen.put("instanceId", iid);
                seen.put("subscription", subscription);
                seen.put("values", values);
                seen.put("keys", keys);
                seen.put("last", lastOut);
                seen.put("commitAnswer", commitAnswer);
                seen.put("committedByQuery", committed(byQuery.getOffsets()));
                seen.put("committedAssigned", committed(assigned.getOffsets()));
                out.put(format, seen);
            }
            System.out.println(GSON.toJson(out));
        } catch (ApiException e) {
            System.err.println("flow failed: HTTP " + e.getCode() + " " + e.getResponseBody());
            System.exit(1);
        }
    }
}
