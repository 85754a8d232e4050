// IBM/sarama driven by kproxy's workload through the client bridge protocol
// (package bridge, docs/workload.md).
//
// A producer is sarama's AsyncProducer (a transactional one with
// Producer.Transaction.ID, Idempotent and Net.MaxOpenRequests=1); a consumer
// is sarama's partition Consumer when it assigns and a ConsumerGroup when it
// subscribes, both read_committed by default. Sarama speaks no transaction
// version 2 (its EndTxn stops at v3).
package main

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"

	"kproxy.local/gobridge/bridge"
)

func main() { bridge.Run(lib{}) }

type lib struct{}

// The oldest Kafka kproxy measures (3.6); sarama lowers each request to what the broker's ApiVersions allow.
var defaultVersion = sarama.V3_6_0_0

func config(s *bridge.Settings) ([]string, *sarama.Config, error) {
	servers, ok := s.Get("bootstrap.servers")
	if !ok {
		return nil, nil, bridge.Bad("bootstrap.servers is required")
	}
	cfg := sarama.NewConfig()
	cfg.Version = defaultVersion
	if v, ok := s.Get("version"); ok {
		version, err := sarama.ParseKafkaVersion(v)
		if err != nil {
			return nil, nil, bridge.Badf("version=%s: %v", v, err)
		}
		cfg.Version = version
	}
	if v, ok := s.Get("client.id"); ok {
		cfg.ClientID = v
	}
	if v, ok := s.Get("security.protocol"); ok && !strings.EqualFold(v, "PLAINTEXT") {
		return nil, nil, bridge.Badf("security.protocol=%s: the sarama client of the workload speaks PLAINTEXT only", v)
	}
	return strings.Split(servers, ","), cfg, nil
}

func millis(s *bridge.Settings, key string, into *time.Duration) error {
	v, ok, err := s.Millis(key)
	if ok {
		*into = v
	}
	return err
}

func number(s *bridge.Settings, key string, into *int) error {
	v, ok := s.Get(key)
	if !ok {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return bridge.Badf("%s=%s is not a number", key, v)
	}
	*into = n
	return nil
}

func producerConfig(s *bridge.Settings) ([]string, *sarama.Config, error) {
	addrs, cfg, err := config(s)
	if err != nil {
		return nil, nil, err
	}
	p := &cfg.Producer
	p.Partitioner = sarama.NewManualPartitioner
	p.Return.Successes, p.Return.Errors = true, true
	p.RequiredAcks = sarama.WaitForAll
	p.Idempotent = true
	cfg.Net.MaxOpenRequests = 1 // what sarama requires of an idempotent producer
	if v, ok := s.Get("transactional.id"); ok {
		p.Transaction.ID = v
	}
	if v, ok := s.Get("enable.idempotence"); ok {
		p.Idempotent = v == "true"
	}
	if v, ok := s.Get("acks"); ok {
		switch v {
		case "all", "-1":
			p.RequiredAcks = sarama.WaitForAll
		case "1":
			p.RequiredAcks = sarama.WaitForLocal
		case "0":
			p.RequiredAcks = sarama.NoResponse
		default:
			return nil, nil, bridge.Badf("acks=%s: expected all, -1, 1 or 0", v)
		}
	}
	if v, ok := s.Get("compression.type"); ok {
		codec := map[string]sarama.CompressionCodec{"none": sarama.CompressionNone, "gzip": sarama.CompressionGZIP,
			"snappy": sarama.CompressionSnappy, "lz4": sarama.CompressionLZ4, "zstd": sarama.CompressionZSTD}
		c, known := codec[v]
		if !known {
			return nil, nil, bridge.Badf("compression.type=%s: expected none, gzip, snappy, lz4 or zstd", v)
		}
		p.Compression = c
	}
	for _, err := range []error{
		millis(s, "request.timeout.ms", &p.Timeout),
		millis(s, "transaction.timeout.ms", &p.Transaction.Timeout),
		millis(s, "linger.ms", &p.Flush.Frequency),
		millis(s, "retry.backoff.ms", &p.Retry.Backoff),
		number(s, "retries", &p.Retry.Max),
		number(s, "max.in.flight.requests.per.connection", &cfg.Net.MaxOpenRequests),
	} {
		if err != nil {
			return nil, nil, err
		}
	}
	return addrs, cfg, s.Unknown("sarama's producer")
}

type consumerSettings struct {
	addrs []string
	cfg   *sarama.Config
	group string
}

func consumerConfig(s *bridge.Settings) (consumerSettings, error) {
	addrs, cfg, err := config(s)
	if err != nil {
		return consumerSettings{}, err
	}
	c := &cfg.Consumer
	c.Return.Errors = true
	c.Offsets.Initial = sarama.OffsetOldest
	c.Offsets.AutoCommit.Enable = false
	c.IsolationLevel = sarama.ReadUncommitted
	out := consumerSettings{addrs: addrs, cfg: cfg}
	out.group, _ = s.Get("group.id")
	if v, ok := s.Get("isolation.level"); ok {
		switch v {
		case "read_committed":
			c.IsolationLevel = sarama.ReadCommitted
		case "read_uncommitted":
		default:
			return out, bridge.Badf("isolation.level=%s: expected read_committed or read_uncommitted", v)
		}
	}
	if v, ok := s.Get("auto.offset.reset"); ok {
		switch v {
		case "earliest":
		case "latest":
			c.Offsets.Initial = sarama.OffsetNewest
		default:
			return out, bridge.Badf("auto.offset.reset=%s: expected earliest or latest", v)
		}
	}
	if v, ok := s.Get("enable.auto.commit"); ok {
		c.Offsets.AutoCommit.Enable = v == "true"
	}
	for _, err := range []error{
		millis(s, "fetch.max.wait.ms", &c.MaxWaitTime),
		millis(s, "session.timeout.ms", &c.Group.Session.Timeout),
		millis(s, "heartbeat.interval.ms", &c.Group.Heartbeat.Interval),
		millis(s, "auto.commit.interval.ms", &c.Offsets.AutoCommit.Interval),
	} {
		if err != nil {
			return out, err
		}
	}
	return out, s.Unknown("sarama's consumer")
}

func (lib) Open(op string, r bridge.Req) (bridge.Client, error) {
	s := bridge.NewSettings(r.Config("config"))
	switch op {
	case "producer":
		addrs, cfg, err := producerConfig(s)
		if err != nil {
			return nil, err
		}
		if err := cfg.Validate(); err != nil {
			return nil, bridge.Bad(err.Error())
		}
		client, err := sarama.NewClient(addrs, cfg)
		if err != nil {
			return nil, err
		}
		// A transactional producer sends InitProducerId here: sarama fences a predecessor when it is built.
		async, err := sarama.NewAsyncProducerFromClient(client)
		if err != nil {
			client.Close()
			return nil, err
		}
		p := &producer{client: client, async: async, deliveries: bridge.NewDeliveries()}
		go p.outcomes()
		return p, nil
	case "consumer":
		cs, err := consumerConfig(s)
		if err != nil {
			return nil, err
		}
		if err := cs.cfg.Validate(); err != nil {
			return nil, bridge.Bad(err.Error())
		}
		return newConsumer(cs)
	default: // admin
		addrs, cfg, err := config(s)
		if err != nil {
			return nil, err
		}
		if err := s.Unknown("sarama's admin client"); err != nil {
			return nil, err
		}
		admin, err := sarama.NewClusterAdmin(addrs, cfg)
		if err != nil {
			return nil, err
		}
		return &adminClient{admin}, nil
	}
}

func (lib) Call(op string, r bridge.Req, c bridge.Client) (any, error) {
	switch c := c.(type) {
	case *producer:
		return c.call(op, r)
	case *consumer:
		return c.call(op, r)
	case *adminClient:
		return c.call(op, r)
	}
	return nil, bridge.Bad("unknown client")
}

// --- the producer ------------------------------------------------------------------------

type producer struct {
	client     sarama.Client
	async      sarama.AsyncProducer
	deliveries *bridge.Deliveries
	closed     chan struct{}
}

// outcomes writes every send's outcome as sarama reports it.
func (p *producer) outcomes() {
	successes, errs := p.async.Successes(), p.async.Errors()
	for successes != nil || errs != nil {
		select {
		case msg, ok := <-successes:
			if !ok {
				successes = nil
				continue
			}
			p.deliveries.Done(msg.Metadata.(int64), msg.Offset, nil)
		case pe, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			f := classify(pe.Err, true)
			p.deliveries.Done(pe.Msg.Metadata.(int64), -1, &f)
		}
	}
}

func (p *producer) Close(clean bool, timeout time.Duration) {
	if !clean {
		p.client.Close() // the connections go first: nothing more reaches the broker, as in a crash
		p.async.AsyncClose()
		return
	}
	done := make(chan struct{})
	go func() { p.async.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
	}
	p.client.Close()
}

// txnFailure is sarama's own verdict on a transactional call's error: its status flags say fatal or abortable.
func (p *producer) txnFailure(err error) error {
	if err == nil {
		return nil
	}
	f := classify(err, true)
	status := p.async.TxnStatus()
	f.Fatal = f.Fatal || status&sarama.ProducerTxnFlagFatalError != 0
	f.Abort = !f.Fatal && status&sarama.ProducerTxnFlagAbortableError != 0
	return &f
}

func (p *producer) call(op string, r bridge.Req) (any, error) {
	switch op {
	case "init_transactions":
		if !p.async.IsTransactional() {
			return nil, p.txnFailure(sarama.ErrNonTransactedProducer)
		}
		return nil, nil // done when the producer was built
	case "begin":
		return nil, p.txnFailure(p.async.BeginTxn())
	case "send":
		id := r.Int("d")
		msg := &sarama.ProducerMessage{Topic: r.Str("topic"), Partition: int32(r.Int("partition")), Metadata: id}
		if key := r.Bytes("key"); key != nil {
			msg.Key = sarama.ByteEncoder(key)
		}
		if value := r.Bytes("value"); value != nil {
			msg.Value = sarama.ByteEncoder(value)
		}
		p.deliveries.Start()
		p.async.Input() <- msg
		return nil, nil
	case "flush": // sarama sends at once (Producer.Flush.Frequency 0): wait for the outcomes
		p.deliveries.Wait(r.Seconds("timeout"))
		return nil, nil
	case "send_offsets":
		cons, _ := bridge.Lookup(r, "consumer").(*consumer)
		if cons == nil {
			return nil, bridge.Bad("send_offsets names no open consumer")
		}
		offsets := map[string][]*sarama.PartitionOffsetMetadata{}
		for tp, o := range r.Offsets("offsets") {
			offsets[tp.Topic] = append(offsets[tp.Topic], &sarama.PartitionOffsetMetadata{Partition: tp.Partition, Offset: o})
		}
		return nil, p.txnFailure(p.async.AddOffsetsToTxnWithGroupMetadata(offsets, cons.groupMetadata()))
	case "commit", "abort":
		var err error
		if op == "commit" {
			err = p.async.CommitTxn() // flushes first
		} else {
			err = p.async.AbortTxn()
		}
		p.deliveries.Wait(r.Seconds("timeout")) // every outcome is out before the reply
		return nil, p.txnFailure(err)
	}
	return nil, bridge.Badf("unknown op %s for a producer", op)
}

// --- the consumer --------------------------------------------------------------------------

type record struct {
	msg        *sarama.ConsumerMessage
	generation int64 // the partition's reading generation: a seek or reassignment drops older records
}

type consumer struct {
	settings consumerSettings
	client   sarama.Client
	records  chan record
	errs     chan error

	mu          sync.Mutex
	partitions  sarama.Consumer // assign mode
	readers     map[bridge.TP]reader
	generations map[bridge.TP]int64
	positions   map[bridge.TP]int64
	assigned    map[bridge.TP]bool
	group       sarama.ConsumerGroup // subscribe mode
	session     sarama.ConsumerGroupSession
	stopGroup   context.CancelFunc
	groupDone   chan struct{}
	next        int64
}

func newConsumer(cs consumerSettings) (*consumer, error) {
	client, err := sarama.NewClient(cs.addrs, cs.cfg)
	if err != nil {
		return nil, err
	}
	return &consumer{settings: cs, client: client, records: make(chan record, 1024), errs: make(chan error, 16),
		readers: map[bridge.TP]reader{}, generations: map[bridge.TP]int64{},
		positions: map[bridge.TP]int64{}, assigned: map[bridge.TP]bool{}}, nil
}

func (c *consumer) Close(clean bool, timeout time.Duration) {
	if !clean {
		c.client.Close() // no LeaveGroup, no commit: a crash
	}
	done := make(chan struct{})
	go func() {
		c.stop()
		c.client.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
	}
}

// stop ends whichever way of reading is running.
func (c *consumer) stop() {
	c.mu.Lock()
	readers := c.readers
	c.readers = map[bridge.TP]reader{}
	partitions, group, stopGroup, groupDone := c.partitions, c.group, c.stopGroup, c.groupDone
	c.partitions, c.group, c.stopGroup = nil, nil, nil
	c.mu.Unlock()
	for _, r := range readers {
		close(r.stop)
		r.pc.AsyncClose()
	}
	if partitions != nil {
		partitions.Close()
	}
	if stopGroup != nil {
		stopGroup()
		group.Close()
		<-groupDone
	}
}

func (c *consumer) groupMetadata() *sarama.ConsumerGroupMetadata {
	meta := sarama.NewConsumerGroupMetadata(c.settings.group) // generation -1, no member: an assigning consumer
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.session != nil {
		meta.GenerationID, meta.MemberID = c.session.GenerationID(), c.session.MemberID()
	}
	return meta
}

func (c *consumer) call(op string, r bridge.Req) (any, error) {
	switch op {
	case "assign":
		return nil, c.assign(r.Partitions("partitions"), r.Offsets("offsets"), r.Seconds("timeout"))
	case "subscribe":
		return nil, c.subscribe(r.Strings("topics"))
	case "poll":
		return c.poll(int(r.Int("max")), r.Seconds("timeout"))
	case "positions":
		c.mu.Lock()
		defer c.mu.Unlock()
		out := []any{}
		for tp, o := range c.positions {
			if c.assigned[tp] {
				out = append(out, []any{tp.Topic, tp.Partition, o})
			}
		}
		return out, nil
	case "commit_offsets":
		return nil, c.commit(r.Offsets("offsets"), r.Seconds("timeout"))
	case "committed":
		found, err := c.committed(r.Partitions("partitions"), r.Seconds("timeout"))
		if err != nil {
			return nil, err
		}
		out := []any{}
		for _, tp := range r.Partitions("partitions") {
			if o, ok := found[tp]; ok {
				out = append(out, []any{tp.Topic, tp.Partition, o})
			} else {
				out = append(out, []any{tp.Topic, tp.Partition, nil})
			}
		}
		return out, nil
	case "assignment":
		c.mu.Lock()
		defer c.mu.Unlock()
		out := []any{}
		for tp := range c.assigned {
			out = append(out, []any{tp.Topic, tp.Partition})
		}
		return out, nil
	case "seek":
		tp := bridge.TP{Topic: r.Str("topic"), Partition: int32(r.Int("partition"))}
		return nil, c.seek(tp, r.Int("offset"))
	}
	return nil, bridge.Badf("unknown op %s for a consumer", op)
}

// reader is one partition consumer and the channel that stops its forwarding into the poll queue.
type reader struct {
	pc   sarama.PartitionConsumer
	stop chan struct{}
}

// closeReader stops reading tp and waits until sarama has let go of it, so it can be read again at once; c.mu is held.
func (c *consumer) closeReader(tp bridge.TP) {
	if r, ok := c.readers[tp]; ok {
		close(r.stop)
		r.pc.Close()
		delete(c.readers, tp)
	}
}

// read starts a partition consumer at offset (sarama's OffsetOldest/OffsetNewest allowed); c.mu is held.
func (c *consumer) read(tp bridge.TP, offset int64) error {
	c.closeReader(tp)
	c.next++
	generation := c.next
	c.generations[tp] = generation
	pc, err := c.partitions.ConsumePartition(tp.Topic, tp.Partition, offset)
	if err != nil {
		return err
	}
	stop := make(chan struct{})
	c.readers[tp] = reader{pc, stop}
	go func() {
		for msg := range pc.Messages() {
			select {
			case c.records <- record{msg, generation}:
			case <-stop:
				return
			}
		}
	}()
	go func() {
		for err := range pc.Errors() {
			select {
			case c.errs <- err.Err:
			default:
			}
		}
	}()
	return nil
}

func (c *consumer) assign(partitions []bridge.TP, offsets map[bridge.TP]int64, timeout time.Duration) error {
	c.mu.Lock()
	subscribed := c.group != nil
	c.mu.Unlock()
	if subscribed {
		c.stop()
	}
	// Where the Java client starts an assigned partition: the offset given, else the group's committed one.
	var missing []bridge.TP
	for _, tp := range partitions {
		if _, ok := offsets[tp]; !ok {
			missing = append(missing, tp)
		}
	}
	committed, err := c.committed(missing, timeout)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.partitions == nil {
		if c.partitions, err = sarama.NewConsumerFromClient(c.client); err != nil {
			return err
		}
	}
	for tp := range c.readers {
		c.closeReader(tp)
		c.generations[tp] = -1
	}
	c.positions, c.assigned = map[bridge.TP]int64{}, map[bridge.TP]bool{}
	for _, tp := range partitions {
		start := c.settings.cfg.Consumer.Offsets.Initial
		if o, ok := offsets[tp]; ok {
			start = o
		} else if o, ok := committed[tp]; ok {
			start = o
		}
		if start >= 0 {
			c.positions[tp] = start
		}
		c.assigned[tp] = true
		if err := c.read(tp, start); err != nil {
			return err
		}
	}
	return nil
}

func (c *consumer) seek(tp bridge.TP, offset int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.group != nil {
		// A claim reads on from where the session started it; sarama has no seek for it.
		return &bridge.Failure{Name: "SeekUnsupported", Message: "sarama's consumer group cannot seek a claimed partition"}
	}
	if !c.assigned[tp] {
		return bridge.Badf("seek on %s-%d, which is not assigned", tp.Topic, tp.Partition)
	}
	c.positions[tp] = offset
	return c.read(tp, offset)
}

// handler feeds the claims of a consumer group session into the poll queue.
type handler struct{ c *consumer }

func (h handler) Setup(s sarama.ConsumerGroupSession) error {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	h.c.session = s
	h.c.assigned, h.c.positions = map[bridge.TP]bool{}, map[bridge.TP]int64{}
	for topic, ps := range s.Claims() {
		for _, p := range ps {
			tp := bridge.TP{Topic: topic, Partition: p}
			h.c.assigned[tp] = true
			h.c.next++
			h.c.generations[tp] = h.c.next
		}
	}
	return nil
}

func (h handler) Cleanup(sarama.ConsumerGroupSession) error {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	h.c.session = nil
	for tp := range h.c.assigned {
		h.c.generations[tp] = -1
	}
	h.c.assigned = map[bridge.TP]bool{}
	return nil
}

func (h handler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	tp := bridge.TP{Topic: claim.Topic(), Partition: claim.Partition()}
	h.c.mu.Lock()
	generation := h.c.generations[tp]
	h.c.mu.Unlock()
	for {
		select {
		case msg, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			select {
			case h.c.records <- record{msg, generation}:
			case <-s.Context().Done():
				return nil
			}
		case <-s.Context().Done():
			return nil
		}
	}
}

func (c *consumer) subscribe(topics []string) error {
	if c.settings.group == "" {
		return bridge.Bad("subscribe needs group.id")
	}
	c.stop()
	group, err := sarama.NewConsumerGroupFromClient(c.settings.group, c.client)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c.mu.Lock()
	c.group, c.stopGroup, c.groupDone = group, cancel, done
	c.mu.Unlock()
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if err := group.Consume(ctx, topics, handler{c}); err != nil {
				if errors.Is(err, sarama.ErrClosedConsumerGroup) {
					return
				}
				select {
				case c.errs <- err:
				default:
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	go func() {
		for err := range group.Errors() {
			select {
			case c.errs <- err:
			default:
			}
		}
	}()
	return nil
}

func (c *consumer) take(rec record, out *[]any) {
	tp := bridge.TP{Topic: rec.msg.Topic, Partition: rec.msg.Partition}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.generations[tp] != rec.generation {
		return // read before a seek or a reassignment
	}
	m := rec.msg
	*out = append(*out, []any{m.Topic, m.Partition, m.Offset, bridge.B64(m.Key), bridge.B64(m.Value)})
	c.positions[tp] = m.Offset + 1
}

func (c *consumer) poll(maxRecords int, timeout time.Duration) (any, error) {
	out := []any{}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var failure error
	for len(out) == 0 {
		select {
		case rec := <-c.records:
			c.take(rec, &out)
		case err := <-c.errs:
			failure = err
		case <-timer.C:
			if failure != nil {
				return nil, failure
			}
			return out, nil
		}
	}
	for len(out) < maxRecords { // what is already here, up to max_records
		select {
		case rec := <-c.records:
			c.take(rec, &out)
		default:
			return out, nil
		}
	}
	return out, nil
}

func (c *consumer) coordinator() (*sarama.Broker, error) {
	if c.settings.group == "" {
		return nil, bridge.Bad("offsets need group.id")
	}
	return c.client.Coordinator(c.settings.group)
}

// retrying calls fn again while Kafka calls its error retriable, for up to timeout; the coordinator is looked up anew.
func (c *consumer) retrying(timeout time.Duration, fn func(*sarama.Broker) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, time.Second))
	defer cancel()
	return bridge.Retrying(ctx, func(err error) bool { return classify(err, true).Retriable }, func() error {
		broker, err := c.coordinator()
		if err != nil {
			return err
		}
		if err = fn(broker); err != nil {
			_ = c.client.RefreshCoordinator(c.settings.group)
		}
		return err
	})
}

func (c *consumer) commit(offsets map[bridge.TP]int64, timeout time.Duration) error {
	if len(offsets) == 0 {
		return nil
	}
	meta := c.groupMetadata()
	req := &sarama.OffsetCommitRequest{Version: 7, ConsumerGroup: c.settings.group,
		ConsumerGroupGeneration: meta.GenerationID, ConsumerID: meta.MemberID}
	for tp, o := range offsets {
		req.AddBlockWithLeaderEpoch(tp.Topic, tp.Partition, o, -1, 0, "")
	}
	return c.retrying(timeout, func(broker *sarama.Broker) error {
		resp, err := broker.CommitOffset(req)
		if err != nil {
			return err
		}
		for _, ps := range resp.Errors {
			for _, code := range ps {
				if code != sarama.ErrNoError {
					return code
				}
			}
		}
		return nil
	})
}

func (c *consumer) committed(partitions []bridge.TP, timeout time.Duration) (map[bridge.TP]int64, error) {
	found := map[bridge.TP]int64{}
	if len(partitions) == 0 || c.settings.group == "" {
		return found, nil
	}
	byTopic := map[string][]int32{}
	for _, tp := range partitions {
		byTopic[tp.Topic] = append(byTopic[tp.Topic], tp.Partition)
	}
	req := sarama.NewOffsetFetchRequest(c.settings.cfg.Version, c.settings.group, byTopic)
	req.RequireStable = true
	err := c.retrying(timeout, func(broker *sarama.Broker) error {
		resp, err := broker.FetchOffset(req)
		if err != nil {
			return err
		}
		if resp.Err != sarama.ErrNoError {
			return resp.Err
		}
		for _, tp := range partitions {
			block := resp.GetBlock(tp.Topic, tp.Partition)
			if block == nil {
				continue
			}
			if block.Err != sarama.ErrNoError {
				return block.Err
			}
			if block.Offset >= 0 {
				found[tp] = block.Offset
			}
		}
		return nil
	})
	return found, err
}

// --- the admin client --------------------------------------------------------------------

type adminClient struct{ admin sarama.ClusterAdmin }

func (a *adminClient) Close(bool, time.Duration) { a.admin.Close() }

func (a *adminClient) call(op string, r bridge.Req) (any, error) {
	if op != "create_topics" {
		return nil, bridge.Badf("unknown op %s for an admin client", op)
	}
	for _, item := range r.Partitions("topics") { // [name, partitions]: the same shape as a topic-partition
		detail := &sarama.TopicDetail{NumPartitions: item.Partition, ReplicationFactor: -1} // the cluster's default
		if err := a.admin.CreateTopic(item.Topic, detail, false); err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return nil, err
		}
	}
	return nil, nil
}

// --- errors ------------------------------------------------------------------------------------

var fatalCodes = map[int16]bool{
	kerr.ProducerFenced.Code: true, kerr.InvalidProducerEpoch.Code: true, kerr.OutOfOrderSequenceNumber.Code: true,
	kerr.UnsupportedVersion.Code: true, kerr.TopicAuthorizationFailed.Code: true, kerr.GroupAuthorizationFailed.Code: true,
	kerr.ClusterAuthorizationFailed.Code: true, kerr.TransactionalIDAuthorizationFailed.Code: true,
	kerr.SaslAuthenticationFailed.Code: true, kerr.FencedInstanceID.Code: true,
}

// clientErrors names sarama's own errors, and says whether the record of a failed send never left the client.
var clientErrors = []struct {
	err       error
	name      string
	retriable bool
	unsent    bool
}{
	{sarama.ErrTransactionNotReady, "ErrTransactionNotReady", false, true},
	{sarama.ErrNonTransactedProducer, "ErrNonTransactedProducer", false, true},
	{sarama.ErrShuttingDown, "ErrShuttingDown", false, true},
	{sarama.ErrTxnOffsetCommit, "ErrTxnOffsetCommit", false, false},
	{sarama.ErrOutOfBrokers, "ErrOutOfBrokers", true, false},
	{sarama.ErrNotConnected, "ErrNotConnected", true, false},
	{sarama.ErrClosedClient, "ErrClosedClient", false, false},
	{sarama.ErrClosedConsumerGroup, "ErrClosedConsumerGroup", false, false},
	{context.DeadlineExceeded, "DeadlineExceeded", true, false},
}

// classify is the workload's reading of a sarama error (docs/workload.md, "Errors"): a Kafka
// error code by Kafka's name for it, sarama's own errors by their Go names.
func classify(err error, enqueued bool) bridge.Failure {
	f := bridge.Failure{Enqueued: enqueued, Message: err.Error()}
	var code sarama.KError
	var config sarama.ConfigurationError
	switch {
	case errors.As(err, &code):
		if ke, ok := kerr.ErrorForCode(int16(code)).(*kerr.Error); ok {
			f.Name, f.Retriable = ke.Message, ke.Retriable
		} else {
			f.Name = "KError" + strconv.Itoa(int(code))
		}
		f.Fatal = fatalCodes[int16(code)]
	case errors.As(err, &config):
		f.Name, f.Enqueued = "ConfigurationError", false
	default:
		f.Name = "SaramaError"
		for _, known := range clientErrors {
			if errors.Is(err, known.err) {
				f.Name, f.Retriable = known.name, known.retriable
				if known.unsent {
					f.Enqueued = false
				}
				break
			}
		}
	}
	f.Abort = !f.Fatal && !f.Retriable
	return f
}

func (lib) Failure(err error, enqueued bool) bridge.Failure { return classify(err, enqueued) }
