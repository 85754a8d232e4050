/*
 * A Kafka Streams word count with exactly_once_v2, written as a Streams user
 * would write one (it knows nothing of kproxy).
 *
 *     WordCount BOOTSTRAP [--lines N] [--timeout SECONDS]
 *
 * It creates a fresh input and output topic (two partitions each) and starts
 * the topology: split each line into words, re-key by word (through a
 * repartition topic), count per word in a state store whose changelog is a
 * compacted topic, and write every updated count to the output. Kafka
 * Streams commits each step's output, changelog writes and consumed offsets
 * in one transaction (processing.guarantee=exactly_once_v2). A stream thread
 * that dies is replaced, and its tasks start again from their last committed
 * transaction. Meanwhile a plain idempotent producer writes N lines of words
 * (default 3000) to the input, a few at a time.
 *
 * A read_committed consumer follows the output until every word's latest
 * count is the number of times the input holds it; a count above that is
 * input processed twice, and fails at once. Then the topology is closed and
 * the changelog is read to its end: its latest count per word must agree.
 * Exits 0 when both agree, 1 when a check fails or the output has not caught
 * up in time, 2 on bad arguments.
 */

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.TreeMap;
import java.util.UUID;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.LongDeserializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.Stores;

public final class WordCount {
    static final String[] WORDS = {"amber", "basil", "cobalt", "dune", "ember", "fern", "garnet", "heath",
                                   "iris", "jade", "kelp", "lichen", "moss", "nectar", "onyx", "pine"};
    static final int PARTITIONS = 2;
    static final String STORE = "counts";
    static final int BATCH = 20;
    static final long PAUSE_MS = 50;

    public static void main(String[] args) throws Exception {
        String bootstrap = null;
        int lines = 3000;
        long timeoutS = 120;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--lines" -> lines = Integer.parseInt(args[++i]);
                case "--timeout" -> timeoutS = Long.parseLong(args[++i]);
                default -> {
                    if (bootstrap != null || args[i].startsWith("-")) {
                        System.err.println("usage: WordCount BOOTSTRAP [--lines N] [--timeout SECONDS]");
                        System.exit(2);
                    }
                    bootstrap = args[i];
                }
            }
        }
        if (bootstrap == null) {
            System.err.println("usage: WordCount BOOTSTRAP [--lines N] [--timeout SECONDS]");
            System.exit(2);
        }
        System.exit(new WordCount(bootstrap, lines, timeoutS).run());
    }

    final String bootstrap;
    final int lines;
    final long deadlineNs;
    final String app = "wordcount-" + UUID.randomUUID().toString().substring(0, 8);
    final String input = app + "-lines";
    final String output = app + "-counts";
    final String changelog = app + "-" + STORE + "-changelog";

    WordCount(String bootstrap, int lines, long timeoutS) {
        this.bootstrap = bootstrap;
        this.lines = lines;
        this.deadlineNs = System.nanoTime() + TimeUnit.SECONDS.toNanos(timeoutS);
    }

    static void say(String text) {
        System.out.println(text);
        System.out.flush();
    }

    int run() throws Exception {
        createTopics();
        Path stateDir = Files.createTempDirectory("wordcount-state-");
        KafkaStreams streams = new KafkaStreams(topology(), streamsConfig(stateDir));
        // What a service does: a stream thread that dies is replaced, and its tasks start again from their
        // last committed transaction.
        streams.setUncaughtExceptionHandler(exception -> {
            say("a stream thread failed (" + exception + "); replacing it");
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.REPLACE_THREAD;
        });
        Map<String, Long> expected;
        try {
            streams.start();
            say("started the topology " + app + " (exactly_once_v2)");
            expected = writeInput();
            String problem = followOutput(expected, streams);
            if (problem != null) {
                say("output check: " + problem);
                return 1;
            }
            say("output check: every word's latest count in " + output + " is its count in the input ("
                + expected.size() + " words)");
        } finally {
            if (!streams.close(Duration.ofSeconds(30))) {
                say("the topology did not stop within 30 s");
            }
            streams.cleanUp();
            Files.deleteIfExists(stateDir);
        }
        Map<String, Long> stored = readToEnd(changelog);
        if (!stored.equals(expected)) {
            say("changelog check: " + changelog + " disagrees with the input: " + differences(stored, expected));
            return 1;
        }
        say("changelog check: " + changelog + " holds the same counts");
        return 0;
    }

    void createTopics() throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(props)) {
            admin.createTopics(List.of(new NewTopic(input, PARTITIONS, (short) 1),
                                       new NewTopic(output, PARTITIONS, (short) 1)))
                 .all().get(30, TimeUnit.SECONDS);
        }
    }

    /** Writes the lines; returns how often each word occurs in them. */
    Map<String, Long> writeInput() throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        Map<String, Long> expected = new TreeMap<>();
        Random random = new Random(lines);
        long words = 0;
        try (KafkaProducer<String, String> producer =
                 new KafkaProducer<>(props, new StringSerializer(), new StringSerializer())) {
            for (int i = 0; i < lines; i++) {
                List<String> line = new ArrayList<>();
                for (int n = 2 + random.nextInt(4); n > 0; n--) {
                    String word = WORDS[random.nextInt(WORDS.length)];
                    line.add(word);
                    expected.merge(word, 1L, Long::sum);
                    words++;
                }
                producer.send(new ProducerRecord<>(input, "line-" + i, String.join(" ", line)));
                if ((i + 1) % BATCH == 0) {  // a stream of input, not one burst: many small transactions
                    producer.flush();
                    Thread.sleep(PAUSE_MS);
                }
            }
            producer.flush();
        }
        say("wrote " + lines + " lines (" + words + " words) to " + input);
        return expected;
    }

    Topology topology() {
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
               .flatMapValues(line -> Arrays.asList(line.split(" ")))
               .groupBy((key, word) -> word, Grouped.with("words", Serdes.String(), Serdes.String()))
               .count(Materialized.<String, Long>as(Stores.inMemoryKeyValueStore(STORE))
                                  .withKeySerde(Serdes.String()).withValueSerde(Serdes.Long()))
               .toStream()
               .to(output, Produced.with(Serdes.String(), Serdes.Long()));
        return builder.build();
    }

    Properties streamsConfig(Path stateDir) {
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // A stream consumer does not leave its group when its thread dies: the thread that replaces it waits
        // for the group to drop the old member, which takes a session timeout (45 s by default).
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 10000);
        props.put("processing.exception.handler.global.enabled", true);  // Streams 5.0's default, and no warning
        return props;
    }

    KafkaConsumer<String, Long> reader() {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, app + "-check");
        return new KafkaConsumer<>(props, new StringDeserializer(), new LongDeserializer());
    }

    List<TopicPartition> partitions(KafkaConsumer<?, ?> consumer, String topic) {
        List<TopicPartition> found = new ArrayList<>();
        for (PartitionInfo info : consumer.partitionsFor(topic, Duration.ofSeconds(30))) {
            found.add(new TopicPartition(topic, info.partition()));
        }
        return found;
    }

    /** Follows the output until it matches; what is wrong (null: nothing). */
    String followOutput(Map<String, Long> expected, KafkaStreams streams) {
        Map<String, Long> latest = new TreeMap<>();
        try (KafkaConsumer<String, Long> consumer = reader()) {
            List<TopicPartition> parts = partitions(consumer, output);
            consumer.assign(parts);
            consumer.seekToBeginning(parts);
            long lastReport = System.nanoTime();
            while (true) {
                for (ConsumerRecord<String, Long> record : consumer.poll(Duration.ofMillis(200))) {
                    latest.put(record.key(), record.value());
                    Long want = expected.get(record.key());
                    if (want == null || record.value() > want) {
                        return "word " + record.key() + " counted " + record.value() + " times at "
                               + record.topic() + "[" + record.partition() + "]@" + record.offset()
                               + ", but the input holds it " + (want == null ? 0 : want)
                               + " times: input processed more than once";
                    }
                }
                if (latest.equals(expected)) {
                    return null;
                }
                if (streams.state() == KafkaStreams.State.ERROR || streams.state() == KafkaStreams.State.NOT_RUNNING) {
                    return "the topology stopped (state " + streams.state() + ")";
                }
                if (System.nanoTime() > deadlineNs) {
                    return "timed out; the output disagrees with the input: " + differences(latest, expected);
                }
                if (System.nanoTime() - lastReport > TimeUnit.SECONDS.toNanos(5)) {
                    lastReport = System.nanoTime();
                    long done = latest.values().stream().mapToLong(Long::longValue).sum();
                    long all = expected.values().stream().mapToLong(Long::longValue).sum();
                    say("output: " + done + " of " + all + " words counted (streams " + streams.state() + ")");
                }
            }
        }
    }

    /** Latest value per key of a topic, read (read_committed) up to its end. */
    Map<String, Long> readToEnd(String topic) {
        Map<String, Long> latest = new TreeMap<>();
        try (KafkaConsumer<String, Long> consumer = reader()) {
            List<TopicPartition> parts = partitions(consumer, topic);
            consumer.assign(parts);
            consumer.seekToBeginning(parts);
            Map<TopicPartition, Long> ends = consumer.endOffsets(parts, Duration.ofSeconds(30));
            Map<TopicPartition, Long> remaining = new HashMap<>(ends);
            while (!remaining.isEmpty() && System.nanoTime() < deadlineNs) {
                for (ConsumerRecord<String, Long> record : consumer.poll(Duration.ofMillis(200))) {
                    latest.put(record.key(), record.value());
                }
                remaining.keySet().removeIf(tp -> consumer.position(tp) >= ends.get(tp));
            }
            if (!remaining.isEmpty()) {
                latest.put("(not read to its end in time: " + remaining.keySet() + ")", -1L);
            }
        }
        return latest;
    }

    static String differences(Map<String, Long> got, Map<String, Long> want) {
        List<String> out = new ArrayList<>();
        for (Map.Entry<String, Long> entry : want.entrySet()) {
            Long have = got.get(entry.getKey());
            if (!entry.getValue().equals(have)) {
                out.add(entry.getKey() + " " + (have == null ? "missing" : have) + " (want " + entry.getValue() + ")");
            }
        }
        for (String key : got.keySet()) {
            if (!want.containsKey(key)) {
                out.add(key + " " + got.get(key) + " (not in the input)");
            }
        }
        return String.join(", ", out);
    }
}
