/*
 * The keyshift comparison workload as a Flink DataStream job: a keyed counter.
 *
 *   KeyedCounter --keys N --rate R --out DIR [--max-parallelism 32] [--value-bytes 100]
 *   KeyedCounter --keys N --out DIR --throughput-records M [--zipf 1.3] [--zipf-groups 8]
 *   (either with [--backend rocksdb|forst] to override the cluster's state backend)
 *
 * Source (parallelism 1): Flink's NumberSequenceSource (0, 1, 2, ...), then a
 * "pace" map that turns record index i into a key:
 *   - i < keys: key i, as fast as the job takes it (the preload: every key gets
 *     its ~100-byte value once, so the state exists before the measurement);
 *   - i >= keys: a uniformly spread key (a 64-bit mix of i, mod keys) at
 *     `rate` records per second (the steady input the rescale is measured under).
 * The index is part of the source's checkpointed position, so a job restored
 * from a savepoint or checkpoint does not preload again.
 *
 * Counter (the measured operator, parallelism p): one ValueState<byte[]> per
 * key, `value-bytes` long, whose first 8 bytes are a running count. For every
 * record after the preload it appends "key_group,epoch_micros" to a file of its
 * own under DIR (one file per subtask attempt), so the benchmark sees from the
 * job's output when each key group stopped and resumed processing, exactly as
 * it does for keyshift. Max parallelism (the number of Flink key groups) is 32,
 * like keyshift's 32 key groups.
 *
 * With --throughput-records M the job is the throughput workload instead: M
 * records, as fast as they are taken, of Zipf-distributed keys drawn like
 * keyshift's generator draws them (per group of keys g = i mod zipf-groups,
 * rank j from the same inverse CDF, key g + zipf-groups * j); the counter
 * logs one "records,epoch_micros" line per 100,000 records instead of a line
 * per record.
 */
package keyshift.bench;

import java.io.BufferedWriter;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Instant;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.functions.RichMapFunction;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.connector.source.lib.NumberSequenceSource;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.util.ParameterTool;
import org.apache.flink.runtime.state.KeyGroupRangeAssignment;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.util.Collector;

public final class KeyedCounter {

    private KeyedCounter() {}

    public static void main(String[] argv) throws Exception {
        ParameterTool args = ParameterTool.fromArgs(argv);
        long keys = args.getLong("keys");
        double rate = args.getDouble("rate", 2000.0);
        String out = args.get("out");
        int maxParallelism = args.getInt("max-parallelism", 32);
        int valueBytes = args.getInt("value-bytes", 100);
        long throughputRecords = args.getLong("throughput-records", 0);
        boolean throughput = throughputRecords > 0;
        double zipf = args.getDouble("zipf", 1.3);
        int zipfGroups = args.getInt("zipf-groups", 8);

        Configuration conf = new Configuration();
        if (args.has("backend")) { // else the cluster's state.backend.type
            conf.setString("state.backend.type", args.get("backend"));
        }
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.setMaxParallelism(maxParallelism);
        long last = throughput ? throughputRecords - 1 : Long.MAX_VALUE;
        RichMapFunction<Long, Tuple2<Long, Boolean>> keyOf =
                throughput ? new ZipfKeys(keys, zipf, zipfGroups) : new Pace(keys, rate);
        env.fromSource(new NumberSequenceSource(0, last),
                        WatermarkStrategy.noWatermarks(), "sequence")
                .uid("sequence").setParallelism(1).setMaxParallelism(1)
                .map(keyOf).uid("pace").name("pace")
                .setParallelism(1).setMaxParallelism(1)
                .keyBy(record -> record.f0, Types.LONG)
                .process(new Counter(out, maxParallelism, valueBytes, throughput ? 100_000 : 0))
                .uid("counter").name("counter")
                .sinkTo(new DiscardingSink<>()).uid("discard").name("discard");
        env.execute("keyshift-compare-counter");
    }

    /** Record index -> (key, preload?): the preload first, then keys at a steady rate. */
    static final class Pace extends RichMapFunction<Long, Tuple2<Long, Boolean>> {
        private final long keys;
        private final long intervalNanos;
        private long next;

        Pace(long keys, double rate) {
            this.keys = keys;
            this.intervalNanos = (long) (1e9 / rate);
        }

        @Override
        public Tuple2<Long, Boolean> map(Long index) throws InterruptedException {
            if (index < keys) {
                return Tuple2.of(index, true);
            }
            long now = System.nanoTime();
            if (next == 0 || now - next > 100_000_000L) {
                next = now; // first steady record, or behind by 100 ms: do not burst
            }
            if (next > now) {
                long wait = next - now;
                Thread.sleep(wait / 1_000_000L, (int) (wait % 1_000_000L));
            }
            next += intervalNanos;
            return Tuple2.of(Long.remainderUnsigned(mix(index), keys), false);
        }

        /** SplitMix64's finaliser: a fixed, well spread function of the index. */
        static long mix(long z) {
            z = (z ^ (z >>> 30)) * 0xbf58476d1ce4e5b9L;
            z = (z ^ (z >>> 27)) * 0x94d049bb133111ebL;
            return z ^ (z >>> 31);
        }
    }

    /** Record index -> a Zipf-distributed key, the way keyshift's generator draws them. */
    static final class ZipfKeys extends RichMapFunction<Long, Tuple2<Long, Boolean>> {
        private final long keys;
        private final double oneMinusS;
        private final int groups;

        ZipfKeys(long keys, double s, int groups) {
            this.keys = keys;
            this.oneMinusS = 1.0 - s;
            this.groups = groups;
        }

        @Override
        public Tuple2<Long, Boolean> map(Long index) {
            long h = Pace.mix(index + 0x9E3779B97F4A7C15L);
            int group = (int) Long.remainderUnsigned(index, groups);
            long n = Math.max(1, (keys - group + groups - 1) / groups);
            double u = (h >>> 11) * 1.1102230246251565e-16;
            double x = Math.pow((Math.pow(n, oneMinusS) - 1.0) * u + 1.0, 1.0 / oneMinusS);
            long j = Math.min(n - 1, (long) x - 1);
            return Tuple2.of(group + groups * j, false);
        }
    }

    /** The keyed counter: one value-bytes blob per key; logs (key group, time) per record. */
    static final class Counter extends KeyedProcessFunction<Long, Tuple2<Long, Boolean>, Void> {
        private static final long FLUSH_NANOS = 50_000_000L;
        private final String out;
        private final int maxParallelism;
        private final int valueBytes;
        private final long progressEvery;
        private transient long processed;
        private transient ValueState<byte[]> blob;
        private transient BufferedWriter writer;
        private transient long lastFlush;

        Counter(String out, int maxParallelism, int valueBytes, long progressEvery) {
            this.out = out;
            this.maxParallelism = maxParallelism;
            this.valueBytes = valueBytes;
            this.progressEvery = progressEvery;
        }

        @Override
        public void open(OpenContext context) throws IOException {
            blob = getRuntimeContext().getState(new ValueStateDescriptor<>("blob", byte[].class));
            int subtask = getRuntimeContext().getTaskInfo().getIndexOfThisSubtask();
            int attempt = getRuntimeContext().getTaskInfo().getAttemptNumber();
            Path dir = Paths.get(out);
            Files.createDirectories(dir);
            String name = String.format("counter-%d-%d-%d.csv", subtask, attempt, System.nanoTime());
            writer = Files.newBufferedWriter(dir.resolve(name), StandardCharsets.US_ASCII);
            lastFlush = System.nanoTime();
        }

        @Override
        public void processElement(Tuple2<Long, Boolean> record, Context ctx, Collector<Void> collector)
                throws IOException {
            byte[] value = blob.value();
            if (value == null) {
                value = new byte[valueBytes];
            }
            long count = 0;
            for (int i = 0; i < 8; i++) {
                count = (count << 8) | (value[i] & 0xff);
            }
            count += 1;
            for (int i = 7; i >= 0; i--) {
                value[i] = (byte) count;
                count >>>= 8;
            }
            blob.update(value);
            if (record.f1) {
                return; // the preload is not logged
            }
            processed += 1;
            if (progressEvery > 0) {
                if (processed % progressEvery == 0) {
                    writer.write(processed + "," + epochMicros() + "\n");
                    writer.flush();
                }
                return;
            }
            int keyGroup = KeyGroupRangeAssignment.assignToKeyGroup(record.f0, maxParallelism);
            writer.write(keyGroup + "," + epochMicros() + "\n");
            long t = System.nanoTime();
            if (t - lastFlush > FLUSH_NANOS) {
                writer.flush();
                lastFlush = t;
            }
        }

        private static long epochMicros() {
            Instant now = Instant.now();
            return now.getEpochSecond() * 1_000_000L + now.getNano() / 1_000;
        }

        @Override
        public void close() throws IOException {
            if (writer != null) {
                writer.close();
            }
        }
    }
}
