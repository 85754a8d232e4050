// Apache Kafka's Java producer, consumer and admin client, driven by kproxy's
// workload over stdin/stdout, one JSON object a line (docs/workload.md).
//
// Requests:  {"id": N, "op": "...", "h": HANDLE, ...arguments}
// Replies:   {"id": N, "ok": RESULT}  or  {"id": N, "error": FAILURE}
// Events:    {"event": "delivery", "d": D, "offset": O}  or  {..., "error": FAILURE}
// FAILURE:   {"name": KAFKA_ERROR_NAME, "retriable": b, "fatal": b, "abort": b, "enqueued": b}
//
// Every client (handle) has one thread, so its requests run in the order they
// were sent and a blocking call of one client never holds up another.
// Keys and values travel in base64. The process ends when stdin closes.

import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.ApiException;
import org.apache.kafka.common.errors.AuthenticationException;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.FencedInstanceIdException;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.errors.OutOfOrderSequenceException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnknownServerException;
import org.apache.kafka.common.errors.UnsupportedVersionException;
import org.apache.kafka.common.protocol.Errors;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class ClientBridge {
    private static final PrintStream OUT =
            new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
    private static final Map<Long, Handle> HANDLES = new ConcurrentHashMap<>();
    private static final AtomicLong NEXT_HANDLE = new AtomicLong(1);
    private static final ThreadFactory DAEMONS = r -> {
        Thread t = new Thread(r);
        t.setDaemon(true);
        return t;
    };
    private static final ExecutorService SHARED = Executors.newCachedThreadPool(DAEMONS);

    /** Bad input from the driver: a bug on the Python side, reported as such. */
    static final class BadRequest extends RuntimeException {
        BadRequest(String message) {
            super(message);
        }
    }

    static final class Handle {
        final ExecutorService thread = Executors.newSingleThreadExecutor(DAEMONS);
        KafkaProducer<byte[], byte[]> producer;
        KafkaConsumer<byte[], byte[]> consumer;
        Admin admin;
        int outstanding; // sends without a delivery outcome yet, guarded by this
    }

    public static void main(String[] args) throws Exception {
        System.setOut(System.err); // stdout carries the protocol only
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            Map<String, Object> request;
            try {
                request = Json.object(Json.parse(line));
            } catch (RuntimeException e) {
                System.err.println("kproxy client bridge: unreadable request: " + e.getMessage());
                continue;
            }
            Object handleId = request.get("h");
            Handle handle = handleId == null ? null : HANDLES.get(((Number) handleId).longValue());
            Runnable task = () -> serve(request, handle);
            if (handleId != null && handle == null) {
                task.run(); // answers "unknown handle"
            } else if (handle != null) {
                handle.thread.submit(task);
            } else {
                SHARED.submit(task);
            }
        }
        for (Handle h : HANDLES.values()) {
            closeQuietly(h, Duration.ZERO);
        }
        OUT.flush();
        System.exit(0);
    }

    private static void serve(Map<String, Object> request, Handle handle) {
        long id = ((Number) request.get("id")).longValue();
        String op = (String) request.get("op");
        Map<String, Object> reply = new LinkedHashMap<>();
        reply.put("id", id);
        try {
            if (request.get("h") != null && handle == null) {
                throw new BadRequest("unknown handle " + request.get("h"));
            }
            reply.put("ok", dispatch(op, request, handle));
        } catch (BadRequest e) {
            reply.put("bad", e.getMessage());
        } catch (Throwable t) {
            reply.put("error", failure(t, !"send".equals(op)));
        }
        emit(reply);
    }

    private static void emit(Map<String, Object> message) {
        String text = Json.write(message);
        synchronized (OUT) {
            OUT.print(text);
            OUT.print('\n');
            OUT.flush();
        }
    }

    // --- requests -------------------------------------------------------------

    private static Object dispatch(String op, Map<String, Object> r, Handle h) throws Exception {
        switch (op) {
            case "producer": {
                Handle created = new Handle();
                Properties props = properties(r.get("config"));
                created.producer = new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
                return register(created);
            }
            case "consumer": {
                Handle created = new Handle();
                Properties props = properties(r.get("config"));
                created.consumer = new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer());
                return register(created);
            }
            case "admin": {
                Handle created = new Handle();
                created.admin = Admin.create(properties(r.get("config")));
                return register(created);
            }
            case "create_topics":
                createTopics(h, r);
                return null;
            case "send":
                send(h, r);
                return null;
            case "flush":
                awaitDeliveries(h, seconds(r, "timeout"));
                return null;
            case "init_transactions":
                h.producer.initTransactions();
                return null;
            case "begin":
                h.producer.beginTransaction();
                return null;
            case "send_offsets": {
                Handle consumer = HANDLES.get(((Number) r.get("consumer")).longValue());
                if (consumer == null || consumer.consumer == null) {
                    throw new BadRequest("send_offsets names no open consumer");
                }
                h.producer.sendOffsetsToTransaction(offsets(r.get("offsets")), consumer.consumer.groupMetadata());
                return null;
            }
            case "commit":
                h.producer.commitTransaction();
                return null;
            case "abort":
                h.producer.abortTransaction();
                return null;
            case "assign": {
                h.consumer.assign(partitions(r.get("partitions")));
                for (Map.Entry<TopicPartition, OffsetAndMetadata> e : offsets(r.get("offsets")).entrySet()) {
                    h.consumer.seek(e.getKey(), e.getValue().offset());
                }
                return null;
            }
            case "subscribe": {
                List<String> topics = new ArrayList<>();
                for (Object t : Json.array(r.get("topics"))) {
                    topics.add((String) t);
                }
                h.consumer.subscribe(topics);
                return null;
            }
            case "poll":
                return poll(h, ((Number) r.get("max")).intValue(), seconds(r, "timeout"));
            case "positions": {
                List<Object> out = new ArrayList<>();
                for (TopicPartition tp : h.consumer.assignment()) {
                    out.add(List.of(tp.topic(), tp.partition(), h.consumer.position(tp, Duration.ofSeconds(1))));
                }
                return out;
            }
            case "commit_offsets":
                h.consumer.commitSync(offsets(r.get("offsets")), seconds(r, "timeout"));
                return null;
            case "committed": {
                Set<TopicPartition> tps = new HashSet<>(partitions(r.get("partitions")));
                Map<TopicPartition, OffsetAndMetadata> found = h.consumer.committed(tps, seconds(r, "timeout"));
                List<Object> out = new ArrayList<>();
                for (TopicPartition tp : tps) {
                    OffsetAndMetadata om = found.get(tp);
                    out.add(java.util.Arrays.asList(tp.topic(), tp.partition(), om == null ? null : om.offset()));
                }
                return out;
            }
            case "assignment": {
                List<Object> out = new ArrayList<>();
                for (TopicPartition tp : h.consumer.assignment()) {
                    out.add(List.of(tp.topic(), tp.partition()));
                }
                return out;
            }
            case "seek": {
                h.consumer.seek(new TopicPartition((String) r.get("topic"), ((Number) r.get("partition")).intValue()),
                        ((Number) r.get("offset")).longValue());
                return null;
            }
            case "close": {
                Duration timeout = Boolean.TRUE.equals(r.get("clean")) ? seconds(r, "timeout") : Duration.ZERO;
                HANDLES.values().remove(h);
                closeQuietly(h, timeout);
                h.thread.shutdown();
                return null;
            }
            default:
                throw new BadRequest("unknown op " + op);
        }
    }

    private static long register(Handle h) {
        long id = NEXT_HANDLE.getAndIncrement();
        HANDLES.put(id, h);
        return id;
    }

    private static void send(Handle h, Map<String, Object> r) {
        long delivery = ((Number) r.get("d")).longValue();
        ProducerRecord<byte[], byte[]> record = new ProducerRecord<>((String) r.get("topic"),
                ((Number) r.get("partition")).intValue(), bytes(r.get("key")), bytes(r.get("value")));
        synchronized (h) {
            h.outstanding++;
        }
        try {
            h.producer.send(record, (metadata, exception) -> {
                Map<String, Object> event = new LinkedHashMap<>();
                event.put("event", "delivery");
                event.put("d", delivery);
                if (exception != null) {
                    event.put("error", failure(exception, true));
                } else {
                    event.put("offset", metadata.hasOffset() ? metadata.offset() : null);
                }
                emit(event);
                synchronized (h) {
                    h.outstanding--;
                    h.notifyAll();
                }
            });
        } catch (RuntimeException e) {
            synchronized (h) {
                h.outstanding--;
                h.notifyAll();
            }
            throw e;
        }
    }

    /** Until every send has its delivery event out (written before this reply) or the timeout passed. */
    private static void awaitDeliveries(Handle h, Duration timeout) throws InterruptedException {
        long deadline = System.nanoTime() + timeout.toNanos();
        synchronized (h) {
            while (h.outstanding > 0) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    return;
                }
                TimeUnit.NANOSECONDS.timedWait(h, left);
            }
        }
    }

    /** At most `max` records; the consumer is moved back to the first record not returned. */
    private static List<Object> poll(Handle h, int max, Duration timeout) {
        ConsumerRecords<byte[], byte[]> records = h.consumer.poll(timeout);
        List<Object> out = new ArrayList<>();
        for (TopicPartition tp : records.partitions()) {
            for (ConsumerRecord<byte[], byte[]> rec : records.records(tp)) {
                if (out.size() >= max) {
                    h.consumer.seek(tp, rec.offset());
                    break;
                }
                out.add(java.util.Arrays.asList(rec.topic(), rec.partition(), rec.offset(), base64(rec.key()),
                        base64(rec.value())));
            }
        }
        return out;
    }

    private static void createTopics(Handle h, Map<String, Object> r) throws Exception {
        List<NewTopic> topics = new ArrayList<>();
        for (Object item : Json.array(r.get("topics"))) {
            List<Object> pair = Json.array(item);
            // Replication as the cluster's default.replication.factor says.
            topics.add(new NewTopic((String) pair.get(0), Optional.of(((Number) pair.get(1)).intValue()), Optional.empty()));
        }
        Duration timeout = seconds(r, "timeout");
        var result = h.admin.createTopics(topics);
        for (var future : result.values().values()) {
            try {
                future.get(timeout.toMillis(), TimeUnit.MILLISECONDS);
            } catch (ExecutionException e) {
                if (!(e.getCause() instanceof TopicExistsException)) {
                    throw e;
                }
            }
        }
    }

    private static void closeQuietly(Handle h, Duration timeout) {
        try {
            if (h.producer != null) {
                h.producer.close(timeout);
            }
            if (h.consumer != null) {
                h.consumer.close(timeout);
            }
            if (h.admin != null) {
                h.admin.close(timeout);
            }
        } catch (RuntimeException e) {
            System.err.println("kproxy client bridge: close failed: " + e);
        }
    }

    // --- errors -------------------------------------------------------------------

    /** The library's exception as kproxy's ClientFailure fields (kproxy/workload/errors.py). */
    static Map<String, Object> failure(Throwable t, boolean enqueued) {
        Throwable e = t;
        while (e.getCause() != null && (e instanceof ExecutionException || e instanceof CompletionException
                || e.getClass() == KafkaException.class)) {
            e = e.getCause();
        }
        String name;
        if (e instanceof ApiException) {
            Errors error = Errors.forException(e);
            name = error == Errors.UNKNOWN_SERVER_ERROR && !(e instanceof UnknownServerException)
                    ? e.getClass().getSimpleName() : error.name();
        } else {
            name = e.getClass().getSimpleName();
        }
        boolean fatal = e instanceof ProducerFencedException || e instanceof InvalidProducerEpochException
                || e instanceof OutOfOrderSequenceException || e instanceof UnsupportedVersionException
                || e instanceof AuthorizationException || e instanceof AuthenticationException
                || e instanceof FencedInstanceIdException;
        boolean retriable = e instanceof RetriableException;
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("name", name);
        out.put("retriable", retriable);
        out.put("fatal", fatal);
        // The Java producer's rule: an error that is neither fatal nor a timeout to retry
        // leaves the transaction needing abortTransaction().
        out.put("abort", !fatal && !retriable && !(e instanceof IllegalStateException));
        out.put("enqueued", enqueued);
        out.put("message", String.valueOf(e.getMessage()));
        return out;
    }

    // --- argument helpers -----------------------------------------------------------

    private static Properties properties(Object config) {
        Properties props = new Properties();
        for (Map.Entry<String, Object> e : Json.object(config).entrySet()) {
            props.put(e.getKey(), String.valueOf(e.getValue()));
        }
        return props;
    }

    private static Duration seconds(Map<String, Object> r, String key) {
        Object value = r.get(key);
        double s = value == null ? 0.0 : ((Number) value).doubleValue();
        return Duration.ofMillis(Math.max(0L, Math.round(s * 1000)));
    }

    private static List<TopicPartition> partitions(Object value) {
        List<TopicPartition> out = new ArrayList<>();
        for (Object item : Json.array(value)) {
            List<Object> pair = Json.array(item);
            out.add(new TopicPartition((String) pair.get(0), ((Number) pair.get(1)).intValue()));
        }
        return out;
    }

    private static Map<TopicPartition, OffsetAndMetadata> offsets(Object value) {
        Map<TopicPartition, OffsetAndMetadata> out = new HashMap<>();
        if (value == null) {
            return out;
        }
        for (Object item : Json.array(value)) {
            List<Object> triple = Json.array(item);
            out.put(new TopicPartition((String) triple.get(0), ((Number) triple.get(1)).intValue()),
                    new OffsetAndMetadata(((Number) triple.get(2)).longValue()));
        }
        return out;
    }

    private static byte[] bytes(Object value) {
        return value == null ? null : Base64.getDecoder().decode((String) value);
    }

    private static String base64(byte[] value) {
        return value == null ? null : Base64.getEncoder().encodeToString(value);
    }

    /** The JSON subset the protocol uses: objects, arrays, strings, numbers, booleans, null. */
    static final class Json {
        private final String s;
        private int i;

        private Json(String s) {
            this.s = s;
        }

        static Object parse(String text) {
            Json p = new Json(text);
            Object v = p.value();
            p.space();
            if (p.i != text.length()) {
                throw new IllegalArgumentException("trailing text at " + p.i);
            }
            return v;
        }

        @SuppressWarnings("unchecked")
        static Map<String, Object> object(Object v) {
            if (v == null) {
                return Map.of();
            }
            if (!(v instanceof Map)) {
                throw new BadRequest("expected an object");
            }
            return (Map<String, Object>) v;
        }

        @SuppressWarnings("unchecked")
        static List<Object> array(Object v) {
            if (!(v instanceof List)) {
                throw new BadRequest("expected an array");
            }
            return (List<Object>) v;
        }

        private void space() {
            while (i < s.length() && Character.isWhitespace(s.charAt(i))) {
                i++;
            }
        }

        private Object value() {
            space();
            if (i >= s.length()) {
                throw new IllegalArgumentException("unexpected end");
            }
            char c = s.charAt(i);
            if (c == '{') {
                Map<String, Object> m = new LinkedHashMap<>();
                i++;
                space();
                if (s.charAt(i) == '}') {
                    i++;
                    return m;
                }
                while (true) {
                    space();
                    String key = string();
                    space();
                    expect(':');
                    m.put(key, value());
                    space();
                    if (s.charAt(i) == ',') {
                        i++;
                        continue;
                    }
                    expect('}');
                    return m;
                }
            }
            if (c == '[') {
                List<Object> a = new ArrayList<>();
                i++;
                space();
                if (s.charAt(i) == ']') {
                    i++;
                    return a;
                }
                while (true) {
                    a.add(value());
                    space();
                    if (s.charAt(i) == ',') {
                        i++;
                        continue;
                    }
                    expect(']');
                    return a;
                }
            }
            if (c == '"') {
                return string();
            }
            if (s.startsWith("true", i)) {
                i += 4;
                return Boolean.TRUE;
            }
            if (s.startsWith("false", i)) {
                i += 5;
                return Boolean.FALSE;
            }
            if (s.startsWith("null", i)) {
                i += 4;
                return null;
            }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) {
                i++;
            }
            String number = s.substring(start, i);
            if (number.isEmpty()) {
                throw new IllegalArgumentException("unexpected character at " + start);
            }
            if (number.contains(".") || number.contains("e") || number.contains("E")) {
                return Double.parseDouble(number);
            }
            return Long.parseLong(number);
        }

        private void expect(char c) {
            if (i >= s.length() || s.charAt(i) != c) {
                throw new IllegalArgumentException("expected '" + c + "' at " + i);
            }
            i++;
        }

        private String string() {
            expect('"');
            StringBuilder b = new StringBuilder();
            while (true) {
                char c = s.charAt(i++);
                if (c == '"') {
                    return b.toString();
                }
                if (c != '\\') {
                    b.append(c);
                    continue;
                }
                char e = s.charAt(i++);
                switch (e) {
                    case 'n': b.append('\n'); break;
                    case 't': b.append('\t'); break;
                    case 'r': b.append('\r'); break;
                    case 'b': b.append('\b'); break;
                    case 'f': b.append('\f'); break;
                    case 'u': b.append((char) Integer.parseInt(s.substring(i, i + 4), 16)); i += 4; break;
                    default: b.append(e);
                }
            }
        }

        static String write(Object v) {
            StringBuilder b = new StringBuilder();
            write(b, v);
            return b.toString();
        }

        private static void write(StringBuilder b, Object v) {
            if (v == null) {
                b.append("null");
            } else if (v instanceof String) {
                b.append('"');
                for (char c : ((String) v).toCharArray()) {
                    if (c == '"' || c == '\\') {
                        b.append('\\').append(c);
                    } else if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
                b.append('"');
            } else if (v instanceof Number || v instanceof Boolean) {
                b.append(v);
            } else if (v instanceof Map) {
                b.append('{');
                boolean first = true;
                for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                    if (!first) {
                        b.append(',');
                    }
                    first = false;
                    write(b, String.valueOf(e.getKey()));
                    b.append(':');
                    write(b, e.getValue());
                }
                b.append('}');
            } else if (v instanceof List) {
                b.append('[');
                boolean first = true;
                for (Object item : (List<?>) v) {
                    if (!first) {
                        b.append(',');
                    }
                    first = false;
                    write(b, item);
                }
                b.append(']');
            } else {
                write(b, String.valueOf(v));
            }
        }
    }
}
