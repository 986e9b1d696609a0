// The consumer flow through the TypeScript client that openapi-generator's `typescript-axios` generates from
// openapi.yaml (unmodified; this file is compiled beside it by tests/integration/test_generated_clients.py):
// produce (binary and json records) -> for a binary and a json instance: create -> subscribe -> poll -> commit -> committed offsets
// (body on the GET, query parameters, none: axios then sends `{}` as the body) -> delete. Prints one JSON object
// with what it saw; exits non-zero on any error.
// Usage: node dist/flow-axios.js <gateway URL> <API key> <topic> <group prefix> <records>
import { isAxiosError } from "axios";
import { Configuration, ConsumerRecord, ConsumersApi, ProduceApi } from "./index";

const [base, apiKey, topic, groupPrefix, count] = process.argv.slice(2);
const n = Number(count);
const config = new Configuration({ basePath: base, accessToken: apiKey });
const consumers = new ConsumersApi(config);
const producer = new ProduceApi(config);

const b64 = (text: string): string => Buffer.from(text, "utf8").toString("base64");
const unb64 = (data: string): string => Buffer.from(data, "base64").toString("utf8");

async function produce(): Promise<number[]> {
    // the first half as binary records (base64, the format named by the contentType parameter), the rest as json
    // records (the body's default media type): one body type, JsonProduceRequest, carries both
    const half = Math.floor(n / 2);
    const binary = (await producer.produceToTopic(topic, {
        records: Array.from({ length: half }, (_, i) => ({ key: b64(JSON.stringify(`k${i}`)), value: b64(JSON.stringify({ n: i })) })),
    }, "application/vnd.kafka.binary.v2+json")).data;
    const json = (await producer.produceToTopic(topic, {
        records: Array.from({ length: n - half }, (_, i) => ({ key: `k${half + i}`, value: { n: half + i } })),
    })).data;
    return [...binary.offsets, ...json.offsets].map((o) => {
        if (o.error_code != null) throw new Error(`produce failed: ${o.error}`);
        return o.offset as number;
    });
}

async function consume(format: "binary" | "json") {
    const group = `${groupPrefix}-${format}`;
    const created = (await consumers.createConsumer(group, {
        name: `axios-${format}`, format, "auto.offset.reset": "earliest", "auto.commit.enable": "false",
    })).data;
    const instanceId = created.instance_id;
    await consumers.subscribe(group, instanceId, { topics: [topic] });
    const subscription = (await consumers.getSubscription(group, instanceId)).data;
    const records: ConsumerRecord[] = [];
    const deadline = Date.now() + 60_000;
    while (records.length < n && Date.now() < deadline) {
        records.push(...(await consumers.getRecords(group, instanceId, 1000)).data);
    }
    const values = records.map((r) => (format === "binary" ? JSON.parse(unb64(r.value)) : r.value));
    const keys = records.map((r) => (format === "binary" ? JSON.parse(unb64(r.key)) : r.key));
    // commit: the binary instance names the last offset of each partition, the json one commits all it got
    const last = new Map<number, number>();
    for (const r of records) last.set(r.partition, Math.max(last.get(r.partition) ?? -1, r.offset));
    const commitAnswer = (format === "binary"
        ? await consumers.commitOffsets(group, instanceId, {
            offsets: [...last].map(([partition, offset]) => ({ topic, partition, offset })),
        })
        : await consumers.commitOffsets(group, instanceId)).data;
    const parts = [...last.keys()].sort();
    const byBody = (await consumers.getCommittedOffsets(group, instanceId, undefined, undefined, {
        partitions: parts.map((partition) => ({ topic, partition })),
    })).data;
    const byQuery = (await consumers.getCommittedOffsets(group, instanceId, parts.map(() => topic), parts)).data;
    const assigned = (await consumers.getCommittedOffsets(group, instanceId)).data;
    await consumers.deleteConsumer(group, instanceId);
    const committed = (list: { partition: number; offset: number }[]) =>
        Object.fromEntries(list.map((o) => [String(o.partition), o.offset]));
    return {
        instanceId,
        subscription: subscription.topics,
        values,
        keys,
        last: Object.fromEntries([...last].map(([p, o]) => [String(p), o])),
        commitAnswer,
        committedByBody: committed(byBody.offsets),
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

main().catch((err: unknown) => {
    const detail = isAxiosError(err) ? `${err.response?.status} ${JSON.stringify(err.response?.data)}` : "";
    console.error("flow failed:", err, detail);
    process.exit(1);
});
