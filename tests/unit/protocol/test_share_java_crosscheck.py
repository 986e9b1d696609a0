"""The share-group codecs cross-checked with Kafka's own generated message classes (the kafka-clients 4.4 jar).

kafka-python, which test_crosscheck.py compares with, has no share-group messages; the jar has. One JVM reads
random messages we encoded (every share-group message and IncrementalAlterConfigs, every version we implement)
with the jar's ``XxxData(Readable, version)`` classes and writes them back: the bytes must be the same, so Kafka
parsed exactly the fields we wrote, in our layout (nullable structs, uuids, int8 arrays, records, tagged-field
sections)."""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path

from hypothesis.errors import NonInteractiveExampleWarning

from service.embedded.kafka import KAFKA_VERSION, cache_dir, find_java
from service.protocol.definitions import ALL_SCHEMAS
from service.protocol.messages import compiled
from tests.unit.protocol.test_roundtrip import message_strategy

JAR = cache_dir() / KAFKA_VERSION / "lib" / f"kafka-clients-{KAFKA_VERSION}.jar"
NAMES = [s for s in ALL_SCHEMAS if "Share" in s.name or s.name.startswith("IncrementalAlterConfigs")]
SAMPLES_PER_VERSION = 8

_JAVA = """
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.util.HexFormat;
import org.apache.kafka.common.protocol.ByteBufferAccessor;
import org.apache.kafka.common.protocol.Message;
import org.apache.kafka.common.protocol.ObjectSerializationCache;
import org.apache.kafka.common.protocol.Readable;

public class Cross {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        HexFormat hex = HexFormat.of();
        String line;
        while ((line = in.readLine()) != null) {
            String[] f = line.split(" ", -1);
            short v = Short.parseShort(f[1]);
            try {
                Class<?> c = Class.forName("org.apache.kafka.common.message." + f[0] + "Data");
                ByteBufferAccessor src = new ByteBufferAccessor(ByteBuffer.wrap(hex.parseHex(f[2])));
                Message m = (Message) c.getConstructor(Readable.class, short.class).newInstance(src, v);
                ObjectSerializationCache cache = new ObjectSerializationCache();
                ByteBuffer out = ByteBuffer.allocate(m.size(cache, v));
                m.write(new ByteBufferAccessor(out), cache, v);
                System.out.println(hex.formatHex(out.array()));
            } catch (Throwable t) {
                Throwable r = t.getCause() != null ? t.getCause() : t;
                System.out.println("ERROR " + r);
            }
        }
    }
}
"""


def test_every_share_message_is_crosschecked() -> None:
    assert len(NAMES) == 16, [s.name for s in NAMES]


def test_java_reads_and_writes_back_our_bytes(tmp_path: Path) -> None:
    assert JAR.is_file(), f"{JAR} is missing: run tools/install-kafka.sh"
    cases = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonInteractiveExampleWarning)
        for schema in NAMES:
            cm = compiled(schema)
            for v in range(schema.versions[0], schema.versions[1] + 1):
                strategy = message_strategy(schema.name, v)
                for _ in range(SAMPLES_PER_VERSION):
                    obj = strategy.example()
                    cases.append((schema.name, v, cm.encode(obj, v)))
    assert len(cases) == 24 * SAMPLES_PER_VERSION  # 24 (message, version) pairs
    # the check can fail: a message cut short does not come back from Java
    cut = compiled("ShareFetchRequest").encode(compiled("ShareFetchRequest").cls(group_id="g", member_id="m"), 2)
    src = tmp_path / "Cross.java"
    src.write_text(_JAVA)
    stdin = "".join(f"{name} {v} {data.hex()}\n" for name, v, data in [*cases, ("ShareFetchRequest", 2, cut[:-3])])
    proc = subprocess.run([find_java(), "-cp", str(JAR), str(src)], input=stdin, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    *answers, truncated = proc.stdout.splitlines()
    assert len(answers) == len(cases), proc.stderr[-2000:]
    assert truncated.startswith("ERROR"), truncated
    bad = [(name, v, data.hex(), back) for (name, v, data), back in zip(cases, answers, strict=True)
           if back != data.hex()]
    assert bad == [], bad[:3]
