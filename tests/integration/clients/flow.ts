// The consumer flow through the TypeScript client that openapi-generator's `typescript-fetch` generates from
// openapi.yaml (unmodified; this file is compiled beside it by tests/integration/test_generated_clients.py):
// produce (binary and json records) -> for a binary and a json instance: create -> subscribe -> poll -> commit -> committed offsets
// (body-free forms) -> delete. Prints one JSON object with what it saw; exits non-zero on any error.
// Usage: node dist/flow.js <gateway URL> <API key> <topic> <group prefix> <records>
import {
    Configuration,
    ConsumerRecord,
    ConsumersApi,
    ProduceApi,
    ResponseError,
} from "./index";

const [base, apiKey, topic, groupPrefix, count] = process.argv.slice(2);
const n = Number(count);
const config = new Configuration({ basePath: base, accessToken: async () => apiKey });
const consumers = new ConsumersApi(config);
const producer = new ProduceApi(config);

const b64 = (text: string): string => Buffer.from(text, "utf8").toString("base64");
const unb64 = (data: string): string => Buffer.from(data, "base64").toString("utf8");

async function produce(): Promise<number[]> {
    // the first half as binary records (base64, the format named by contentType), the rest as json records (the
    // body's default media type): one body type, JsonProduceRequest, carries both
    const half = Math.floor(n / 2);
    const binary = await producer.produceToTopic({
        topic,
        contentType: "application/vnd.kafka.binary.v2+json",
        jsonProduceRequest: {
            records: Array.from({ length: half }, (_, i) => ({ key: b64(JSON.stringify(`k${i}`)), value: b64(JSON.stringify({ n: i })) })),
        },
    });
    const json = await producer.produceToTopic({
        topic,
        jsonProduceRequest: { records: Array.from({ length: n - half }, (_, i) => ({ key: `k${half + i}`, value: { n: half + i } })) },
    });
    return [...binary.offsets, ...json.offsets].map((o) => {
        if (o.errorCode != null) throw new Error(`produce failed: ${o.error}`);
        return o.offset as number;
    });
}

async function consume(format: "binary" | "json") {
    const group = `${groupPrefix}-${format}`;
    const created = await consumers.createConsumer({
        group,
        createConsumer: { name: `ts-${format}`, format, autoOffsetReset: "earliest", autoCommitEnable: "false" },
    });
    const instanceId = created.instanceId;
    await consumers.subscribe({ group, instanceId, subscription: { topics: [topic] } });
    const subscription = await consumers.getSubscription({ group, instanceId });
    const records: ConsumerRecord[] = [];
    const deadline = Date.now() + 60_000;
    while (records.length < n && Date.now() < deadline) {
        records.push(...(await consumers.getRecords({ group, instanceId, timeout: 1000 })));
    }
    const values = records.map((r) => (format === "binary" ? JSON.parse(unb64(r.value)) : r.value));
    const keys = records.map((r) => (format === "binary" ? JSON.parse(unb64(r.key)) : r.key));
    // commit: the binary instance names the last offset of each partition, the json one commits all it got
    const last = new Map<number, number>();
    for (const r of records) last.set(r.partition, Math.max(last.get(r.partition) ?? -1, r.offset));
    const commitAnswer = format === "binary"
        ? await consumers.commitOffsets({
            group, instanceId,
            commitOffsets: { offsets: [...last].map(([partition, offset]) => ({ topic, partition, offset })) },
        })
        : await consumers.commitOffsets({ group, instanceId });
    const parts = [...last.keys()].sort();
    const byQuery = await consumers.getCommittedOffsets({
        group, instanceId, topic: parts.map(() => topic), partition: parts,
    });
    const assigned = await consumers.getCommittedOffsets({ group, instanceId });
    await consumers.deleteConsumer({ group, instanceId });
    const committed = (list: { partition: number; offset: number }[]) =>
        Object.fromEntries(list.map((o) => [String(o.partition), o.offset]));
    return {
        instanceId,
        subscription: subscription.topics,
        values,
        keys,
        last: Object.fromEntries([...last].map(([p, o]) => [String(p), o])),
        commitAnswer,
        committedByQuery: committed(byQuery.offsets),
        committedAssigned: committed(assigned.offsets),
    };
}

async function main(): Promise<void> {
    const produced = await produce();
    const binary = await consume("binary");
    const json = await consume("json");
    console.log(JSON.stringify({ produced, binary, json }));
}

main().catch(async (err: unknown) => {
    const detail = err instanceof ResponseError ? `${err.response.status} ${await err.response.text()}` : "";
    console.error("flow failed:", err, detail);
    process.exit(1);
});
