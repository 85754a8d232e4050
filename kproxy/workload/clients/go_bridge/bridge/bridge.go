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
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
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

// Library turns requests into calls of one Kafka client library.
type Library interface {
	// Open builds a client for the ops "producer", "consumer" and "admin".
	Open(op string, r Req) (Client, error)
	// Call runs any other op on the client of a handle.
	Call(op string, r Req, c Client) (any, error)
	// Failure classifies an error the library returned; enqueued is false for a send the library refused.
	Failure(err error, enqueued bool) Failure
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
		c, err := s.lib.Open(op, r)
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
	return s.lib.Call(op, r, h.client)
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
