// Package bridge speaks the client bridge protocol of kproxy's workload over
// stdin/stdout, one JSON object a line, exactly as java_bridge/ClientBridge.java
// does (docs/workload.md), so that one Python adapter drives every bridge:
//
//	Requests:  {"id": N, "op": "...", "h": HANDLE, ...arguments}
//	Replies:   {"id": N, "ok": RESULT}  or  {"id": N, "error": FAILURE}  or  {"id": N, "bad": TEXT}
//	Events:    {"event": "delivery", "d": D, "offset": O}  or  {..., "error": FAILURE}
//	FAILURE:   {"name": KAFKA_ERROR_NAME, "retriable": b, "fatal": b, "abort": b, "enqueued": b, "message": s}
//
// Every client (handle) has one goroutine, so its requests run in the order
// they were sent and a blocking call of one client never holds up another.
// Keys and values travel in base64. The process ends when stdin closes.
package bridge

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Failure is a library error as the workload's ClientFailure fields (kproxy/workload/errors.py).
type Failure struct {
	Name      string `json:"name"`
	Retriable bool   `json:"retriable"`
	Fatal     bool   `json:"fatal"`
	Abort     bool   `json:"abort"`
	Enqueued  bool   `json:"enqueued"`
	Message   string `json:"message"`
}

func (f *Failure) Error() string { return f.Name + ": " + f.Message }

// Bad is a request the driver should not have sent: a bug on the Python side, or a setting the library lacks.
type Bad string

func (b Bad) Error() string { return string(b) }

// Badf builds a Bad.
func Badf(format string, args ...any) error { return Bad(fmt.Sprintf(format, args...)) }

// Client is what a handle holds: a producer, consumer or admin client of one library.
type Client interface {
	// Close ends the client; clean=false drops everything at once (a crash).
	Close(clean bool, timeout time.Duration)
}

// Library builds the clients of one Kafka client library from their settings and reads its errors.
// A setting no option takes is refused (Settings.Unknown).
type Library interface {
	Producer(s *Settings) (Producer, error)
	Consumer(s *Settings) (Consumer, error)
	Admin(s *Settings) (Admin, error)
	// Failure classifies an error the library returned; enqueued is false for a send the library refused.
	Failure(err error, enqueued bool) Failure
}

// Producer is a library's producer, as the workload's ProducerClient needs it.
type Producer interface {
	Client
	InitTransactions(timeout time.Duration) error
	Begin() error
	// Send hands a record over; its outcome goes out later through Deliveries.Done(id, ...).
	Send(id int64, topic string, partition int32, key, value []byte)
	// Flush returns once every send has its outcome out, or when the timeout passed.
	Flush(timeout time.Duration)
	SendOffsets(consumer Client, offsets map[TP]int64, timeout time.Duration) error
	End(commit bool, timeout time.Duration) error
}

// Consumer is a library's consumer; its Reading holds the positions and assignment the replies are made of.
type Consumer interface {
	Client
	Assign(partitions []TP, offsets map[TP]int64, timeout time.Duration) error
	Subscribe(topics []string) error
	// Poll returns at most max records as [topic, partition, offset, key, value], noting each in Reading.
	Poll(max int, timeout time.Duration) ([]any, error)
	Commit(offsets map[TP]int64, timeout time.Duration) error
	Committed(partitions []TP, timeout time.Duration) (map[TP]int64, error)
	Seek(tp TP, offset int64) error
	Reading() *Reading
}

// Admin creates topics: (name, partitions) pairs, the cluster's default replication; an existing topic is fine.
type Admin interface {
	Client
	CreateTopics(topics []TP, timeout time.Duration) error
}

// Reading is what a consumer has read: the next offset of each partition, and the partitions it holds.
type Reading struct {
	mu        sync.Mutex
	positions map[TP]int64
	assigned  map[TP]bool
}

// NewReading is an empty Reading.
func NewReading() *Reading { return &Reading{positions: map[TP]int64{}, assigned: map[TP]bool{}} }

// Reset holds exactly these partitions, at the positions known (a partition without one has none yet).
func (r *Reading) Reset(assigned []TP, positions map[TP]int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.positions, r.assigned = map[TP]int64{}, map[TP]bool{}
	for _, tp := range assigned {
		r.assigned[tp] = true
		if o, ok := positions[tp]; ok {
			r.positions[tp] = o
		}
	}
}

// Hold adds or drops partitions (a group's assignment changing).
func (r *Reading) Hold(tps []TP, held bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, tp := range tps {
		if held {
			r.assigned[tp] = true
		} else {
			delete(r.assigned, tp)
			delete(r.positions, tp)
		}
	}
}

// At sets the next offset to read of a partition.
func (r *Reading) At(tp TP, offset int64) {
	r.mu.Lock()
	r.positions[tp] = offset
	r.mu.Unlock()
}

// Holds says whether the consumer holds a partition.
func (r *Reading) Holds(tp TP) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.assigned[tp]
}

// Held lists the partitions the consumer holds.
func (r *Reading) Held() []TP {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []TP{}
	for tp := range r.assigned {
		out = append(out, tp)
	}
	return out
}

func (r *Reading) positionsReply() []any {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []any{}
	for tp, o := range r.positions {
		if r.assigned[tp] {
			out = append(out, []any{tp.Topic, tp.Partition, o})
		}
	}
	return out
}

func timeoutOf(r Req) time.Duration {
	if t := r.Seconds("timeout"); t > 0 {
		return t
	}
	return 5 * time.Second
}

// call runs an op on a producer, consumer or admin client.
func call(op string, r Req, c Client) (any, error) {
	timeout := timeoutOf(r)
	switch c := c.(type) {
	case Producer:
		switch op {
		case "init_transactions":
			return nil, c.InitTransactions(timeout)
		case "begin":
			return nil, c.Begin()
		case "send":
			c.Send(r.Int("d"), r.Str("topic"), int32(r.Int("partition")), r.Bytes("key"), r.Bytes("value"))
			return nil, nil
		case "flush":
			c.Flush(r.Seconds("timeout"))
			return nil, nil
		case "send_offsets":
			consumer := Lookup(r, "consumer")
			if _, ok := consumer.(Consumer); !ok {
				return nil, Bad("send_offsets names no open consumer")
			}
			return nil, c.SendOffsets(consumer, r.Offsets("offsets"), timeout)
		case "commit", "abort":
			return nil, c.End(op == "commit", timeout)
		}
	case Consumer:
		switch op {
		case "assign":
			return nil, c.Assign(r.Partitions("partitions"), r.Offsets("offsets"), timeout)
		case "subscribe":
			return nil, c.Subscribe(r.Strings("topics"))
		case "poll":
			return c.Poll(int(r.Int("max")), r.Seconds("timeout"))
		case "positions":
			return c.Reading().positionsReply(), nil
		case "commit_offsets":
			if offsets := r.Offsets("offsets"); len(offsets) > 0 {
				return nil, c.Commit(offsets, timeout)
			}
			return nil, nil
		case "committed":
			partitions := r.Partitions("partitions")
			found, err := c.Committed(partitions, timeout)
			if err != nil {
				return nil, err
			}
			out := []any{}
			for _, tp := range partitions {
				if o, ok := found[tp]; ok {
					out = append(out, []any{tp.Topic, tp.Partition, o})
				} else {
					out = append(out, []any{tp.Topic, tp.Partition, nil})
				}
			}
			return out, nil
		case "assignment":
			out := []any{}
			for _, tp := range c.Reading().Held() {
				out = append(out, []any{tp.Topic, tp.Partition})
			}
			return out, nil
		case "seek":
			return nil, c.Seek(TP{Topic: r.Str("topic"), Partition: int32(r.Int("partition"))}, r.Int("offset"))
		}
	case Admin:
		if op == "create_topics" {
			return nil, c.CreateTopics(r.Partitions("topics"), timeout) // [name, partitions]: a topic-partition's shape
		}
	}
	return nil, Badf("unknown op %s for this client", op)
}

type handle struct {
	client Client
	queue  chan func()
}

// Server reads requests from stdin and writes replies and events to stdout.
type Server struct {
	lib     Library
	outMu   sync.Mutex
	out     *bufio.Writer
	mu      sync.Mutex
	handles map[int64]*handle
	next    int64
}

func (s *Server) accept(line []byte) {
	dec := json.NewDecoder(strings.NewReader(string(line)))
	dec.UseNumber()
	var r Req
	if err := dec.Decode(&r); err != nil {
		fmt.Fprintf(os.Stderr, "kproxy client bridge: unreadable request: %v\n", err)
		return
	}
	id, _ := r["id"].(json.Number).Int64()
	hid, named := r["h"]
	if !named || hid == nil {
		go s.serve(id, r, nil)
		return
	}
	n, _ := hid.(json.Number).Int64()
	s.mu.Lock()
	h := s.handles[n]
	s.mu.Unlock()
	if h == nil {
		s.emit(map[string]any{"id": id, "bad": fmt.Sprintf("unknown handle %d", n)})
		return
	}
	h.queue <- func() { s.serve(id, r, h) }
}

func (s *Server) serve(id int64, r Req, h *handle) {
	op := r.Str("op")
	reply := map[string]any{"id": id}
	result, err := s.dispatch(op, r, h)
	switch e := err.(type) {
	case nil:
		reply["ok"] = result
	case Bad:
		reply["bad"] = string(e)
	case *Failure:
		reply["error"] = e
	default:
		f := s.lib.Failure(err, op != "send")
		reply["error"] = &f
	}
	s.emit(reply)
}

func (s *Server) dispatch(op string, r Req, h *handle) (result any, err error) {
	defer func() {
		if p := recover(); p != nil {
			if bad, ok := p.(Bad); ok {
				err = bad
			} else {
				err = Badf("%s panicked: %v", op, p)
			}
		}
	}()
	switch op {
	case "producer", "consumer", "admin":
		c, err := s.open(op, NewSettings(r.Config("config")))
		if err != nil {
			return nil, err
		}
		return s.register(c), nil
	case "close":
		if h == nil {
			return nil, Bad("close names no handle")
		}
		s.mu.Lock()
		for id, other := range s.handles {
			if other == h {
				delete(s.handles, id)
			}
		}
		s.mu.Unlock()
		timeout := time.Duration(0)
		if r.Bool("clean") {
			timeout = r.Seconds("timeout")
		}
		// The queue stays open: a request that raced the close still runs, and is told its handle is closed.
		h.client.Close(r.Bool("clean"), timeout)
		return nil, nil
	}
	if h == nil {
		return nil, Badf("%s names no handle", op)
	}
	return call(op, r, h.client)
}

func (s *Server) open(op string, settings *Settings) (Client, error) {
	switch op {
	case "producer":
		return s.lib.Producer(settings)
	case "consumer":
		return s.lib.Consumer(settings)
	}
	return s.lib.Admin(settings)
}

func (s *Server) register(c Client) int64 {
	h := &handle{client: c, queue: make(chan func(), 64)}
	go func() {
		for task := range h.queue {
			task()
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.next
	s.next++
	s.handles[id] = h
	return id
}

// Client looks up another handle's client (a consumer named by send_offsets).
func (s *Server) Client(r Req, key string) Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.handles[r.Int(key)]; h != nil {
		return h.client
	}
	return nil
}

var server *Server

func (s *Server) emit(message map[string]any) {
	data, err := json.Marshal(message)
	if err != nil {
		data, _ = json.Marshal(map[string]any{"id": message["id"], "bad": "unencodable reply: " + err.Error()})
	}
	s.outMu.Lock()
	defer s.outMu.Unlock()
	s.out.Write(data)
	s.out.WriteByte('\n')
	s.out.Flush()
}

// Deliveries counts a producer's sends whose outcome is not out yet, and writes each outcome as an event.
type Deliveries struct {
	mu          sync.Mutex
	cond        *sync.Cond
	outstanding int
	emit        func(map[string]any)
}

// NewDeliveries tracks the sends of one producer.
func NewDeliveries() *Deliveries {
	d := &Deliveries{emit: func(m map[string]any) { server.emit(m) }}
	d.cond = sync.NewCond(&d.mu)
	return d
}

// Start counts a send before it is handed to the library.
func (d *Deliveries) Start() {
	d.mu.Lock()
	d.outstanding++
	d.mu.Unlock()
}

// Done writes delivery `id`'s outcome (offset < 0: none known), then stops counting it.
func (d *Deliveries) Done(id int64, offset int64, failure *Failure) {
	event := map[string]any{"event": "delivery", "d": id}
	if failure != nil {
		event["error"] = failure
	} else if offset >= 0 {
		event["offset"] = offset
	} else {
		event["offset"] = nil
	}
	d.emit(event)
	d.Cancel()
}

// Cancel stops counting a send the library refused before taking it.
func (d *Deliveries) Cancel() {
	d.mu.Lock()
	d.outstanding--
	d.cond.Broadcast()
	d.mu.Unlock()
}

// Wait returns once every counted send has its outcome written, or when the timeout passed.
func (d *Deliveries) Wait(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() {
		d.mu.Lock()
		d.cond.Broadcast()
		d.mu.Unlock()
	})
	defer timer.Stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	for d.outstanding > 0 && time.Now().Before(deadline) {
		d.cond.Wait()
	}
}

// Run serves the protocol until stdin closes, then closes every client still open: a bridge's main.
func Run(lib Library) {
	s := &Server{lib: lib, out: bufio.NewWriter(os.Stdout), handles: map[int64]*handle{}, next: 1}
	server = s
	in := bufio.NewReaderSize(os.Stdin, 1<<20)
	for {
		line, err := in.ReadBytes('\n')
		if len(strings.TrimSpace(string(line))) > 0 {
			s.accept(line)
		}
		if err != nil {
			break
		}
	}
	s.mu.Lock()
	open := s.handles
	s.handles = map[int64]*handle{}
	s.mu.Unlock()
	for _, h := range open {
		h.client.Close(false, 0)
	}
	s.outMu.Lock()
	s.out.Flush()
	s.outMu.Unlock()
}

// Lookup finds the client of another handle named in a request (send_offsets' consumer).
func Lookup(r Req, key string) Client { return server.Client(r, key) }

// ClientError is one of a library's own errors: its name, and whether a send that failed with it never left the client.
type ClientError struct {
	Err       error
	Name      string
	Retriable bool
	Unsent    bool
}

// fatal are the errors the Java client calls fatal (fenced, epoch, sequence, version, authorization).
var fatal = map[int16]bool{
	kerr.ProducerFenced.Code: true, kerr.InvalidProducerEpoch.Code: true, kerr.OutOfOrderSequenceNumber.Code: true,
	kerr.UnsupportedVersion.Code: true, kerr.TopicAuthorizationFailed.Code: true, kerr.GroupAuthorizationFailed.Code: true,
	kerr.ClusterAuthorizationFailed.Code: true, kerr.TransactionalIDAuthorizationFailed.Code: true,
	kerr.SaslAuthenticationFailed.Code: true, kerr.FencedInstanceID.Code: true,
}

// Classify reads an error the way every client of the workload does (docs/workload.md, "Errors"):
// a Kafka error code (code finds one) by Kafka's name and retriable flag, else one of the
// library's known errors by its name, else `other`. A transaction must be aborted after an
// error that is neither fatal nor retriable: the Java client's rule.
func Classify(err error, enqueued bool, code func(error) (int16, bool), known []ClientError, other string) Failure {
	f := Failure{Name: other, Enqueued: enqueued, Message: err.Error()}
	if c, ok := code(err); ok {
		f.Name, f.Fatal = fmt.Sprintf("KAFKA_ERROR_%d", c), fatal[c]
		if ke, ok := kerr.ErrorForCode(c).(*kerr.Error); ok {
			f.Name, f.Retriable = ke.Message, ke.Retriable
		}
	} else {
		for _, k := range append(known, ClientError{context.DeadlineExceeded, "DeadlineExceeded", true, false}) {
			if errors.Is(err, k.Err) {
				f.Name, f.Retriable, f.Enqueued = k.Name, k.Retriable, enqueued && !k.Unsent
				break
			}
		}
	}
	f.Abort = !f.Fatal && !f.Retriable
	return f
}

// Retrying calls fn again while it fails with an error the library calls retriable
// (CONCURRENT_TRANSACTIONS, NOT_COORDINATOR, UNSTABLE_OFFSET_COMMIT, ...), as the Java
// client does inside its calls, until ctx ends.
func Retrying(ctx context.Context, retriable func(error) bool, fn func() error) error {
	for {
		err := fn()
		if err == nil || !retriable(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Within runs fn and waits for it at most timeout; whether it finished. A close that hangs is left behind.
func Within(timeout time.Duration, fn func()) bool {
	done := make(chan struct{})
	go func() { fn(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// StartOffsets is where the Java client starts assigned partitions: the offset given, else the
// group's committed one; a partition in neither starts where auto.offset.reset says (not in the map).
func StartOffsets(c Consumer, partitions []TP, offsets map[TP]int64, timeout time.Duration) (map[TP]int64, error) {
	var missing []TP
	for _, tp := range partitions {
		if _, ok := offsets[tp]; !ok {
			missing = append(missing, tp)
		}
	}
	start, err := c.Committed(missing, timeout)
	if err != nil {
		return nil, err
	}
	for _, tp := range partitions {
		if o, ok := offsets[tp]; ok {
			start[tp] = o
		}
	}
	return start, nil
}

// GroupOffsets groups offsets by topic, as requests carry them.
func GroupOffsets(offsets map[TP]int64) map[string]map[int32]int64 {
	out := map[string]map[int32]int64{}
	for tp, o := range offsets {
		if out[tp.Topic] == nil {
			out[tp.Topic] = map[int32]int64{}
		}
		out[tp.Topic][tp.Partition] = o
	}
	return out
}

// GroupPartitions groups partitions by topic.
func GroupPartitions(tps []TP) map[string][]int32 {
	out := map[string][]int32{}
	for _, tp := range tps {
		out[tp.Topic] = append(out[tp.Topic], tp.Partition)
	}
	return out
}

// --- arguments ---------------------------------------------------------------------

// Req is one decoded request.
type Req map[string]any

// TP is a topic-partition.
type TP struct {
	Topic     string
	Partition int32
}

// Str is a string argument.
func (r Req) Str(key string) string {
	v, _ := r[key].(string)
	return v
}

// Int is an integer argument (0 when absent).
func (r Req) Int(key string) int64 {
	n, ok := r[key].(json.Number)
	if !ok {
		return 0
	}
	if i, err := n.Int64(); err == nil {
		return i
	}
	f, _ := n.Float64()
	return int64(f)
}

// Bool is a boolean argument.
func (r Req) Bool(key string) bool {
	v, _ := r[key].(bool)
	return v
}

// Seconds is a duration given in seconds.
func (r Req) Seconds(key string) time.Duration {
	n, ok := r[key].(json.Number)
	if !ok {
		return 0
	}
	f, _ := n.Float64()
	if f < 0 {
		f = 0
	}
	return time.Duration(f * float64(time.Second))
}

// Bytes is a base64 argument; nil when null.
func (r Req) Bytes(key string) []byte {
	s, ok := r[key].(string)
	if !ok {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		panic(Badf("%s is not base64", key))
	}
	return b
}

// Strings is a list of strings.
func (r Req) Strings(key string) []string {
	var out []string
	for _, v := range list(r[key]) {
		s, _ := v.(string)
		out = append(out, s)
	}
	return out
}

// Config is a settings object, every value as text.
func (r Req) Config(key string) map[string]string {
	out := map[string]string{}
	m, _ := r[key].(map[string]any)
	for k, v := range m {
		out[k] = fmt.Sprint(v)
	}
	return out
}

// Partitions is a list of [topic, partition].
func (r Req) Partitions(key string) []TP {
	var out []TP
	for _, item := range list(r[key]) {
		pair := list(item)
		out = append(out, TP{pair[0].(string), int32(num(pair[1]))})
	}
	return out
}

// Offsets is a list of [topic, partition, offset].
func (r Req) Offsets(key string) map[TP]int64 {
	out := map[TP]int64{}
	for _, item := range list(r[key]) {
		triple := list(item)
		out[TP{triple[0].(string), int32(num(triple[1]))}] = num(triple[2])
	}
	return out
}

func list(v any) []any {
	if v == nil {
		return nil
	}
	l, ok := v.([]any)
	if !ok {
		panic(Bad("expected an array"))
	}
	return l
}

func num(v any) int64 {
	n, ok := v.(json.Number)
	if !ok {
		panic(Bad("expected a number"))
	}
	i, err := n.Int64()
	if err != nil {
		panic(Bad("expected an integer"))
	}
	return i
}

// B64 encodes a key or value for a poll reply.
func B64(b []byte) any {
	if b == nil {
		return nil
	}
	return base64.StdEncoding.EncodeToString(b)
}

// Settings reads a client's settings, refusing any name the library has no option for.
type Settings struct {
	values map[string]string
	used   map[string]bool
}

// NewSettings wraps a config object.
func NewSettings(values map[string]string) *Settings {
	return &Settings{values: values, used: map[string]bool{}}
}

// Get returns a setting and marks it understood.
func (s *Settings) Get(key string) (string, bool) {
	s.used[key] = true
	v, ok := s.values[key]
	return v, ok
}

// Choice reads a setting that takes one of a few values: choices says what each one means.
func Choice[T any](s *Settings, key string, fallback T, choices map[string]T) (T, error) {
	v, ok := s.Get(key)
	if !ok {
		return fallback, nil
	}
	meaning, known := choices[v]
	if !known {
		var names []string
		for name := range choices {
			names = append(names, name)
		}
		sort.Strings(names)
		return fallback, Badf("%s=%s: expected one of %s", key, v, strings.Join(names, ", "))
	}
	return meaning, nil
}

// The choices of the settings every client has, as Choice takes them.
var (
	Acks            = map[string]int16{"all": -1, "-1": -1, "1": 1, "0": 0}
	ReadCommitted   = map[string]bool{"read_committed": true, "read_uncommitted": false}
	Latest          = map[string]bool{"earliest": false, "latest": true}
	TrueFalse       = map[string]bool{"true": true, "false": false}
	CompressionType = []string{"none", "gzip", "snappy", "lz4", "zstd"}
)

// Indexes maps each name to its place in names: a choice among a library's values listed in that order.
func Indexes(names []string) map[string]int {
	out := map[string]int{}
	for i, name := range names {
		out[name] = i
	}
	return out
}

// Millis reads a setting in milliseconds.
func (s *Settings) Millis(key string) (time.Duration, bool, error) {
	v, ok := s.Get(key)
	if !ok {
		return 0, false, nil
	}
	var ms int64
	if _, err := fmt.Sscan(v, &ms); err != nil {
		return 0, false, Badf("%s=%s is not a number of milliseconds", key, v)
	}
	return time.Duration(ms) * time.Millisecond, true, nil
}

// Unknown is an error naming every setting nobody asked for, or nil.
func (s *Settings) Unknown(library string) error {
	var unknown []string
	for k := range s.values {
		if !s.used[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	return Badf("%s has no setting %s (docs/workload.md lists the settings it maps)", library, strings.Join(unknown, ", "))
}
