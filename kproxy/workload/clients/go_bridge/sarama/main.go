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
	if p.Idempotent, err = bridge.Choice(s, "enable.idempotence", true, bridge.TrueFalse); err != nil {
		return nil, nil, err
	}
	acks, err := bridge.Choice(s, "acks", -1, bridge.Acks)
	if err != nil {
		return nil, nil, err
	}
	p.RequiredAcks = sarama.RequiredAcks(acks) // sarama's values are Kafka's: -1, 1, 0
	codecs := []sarama.CompressionCodec{sarama.CompressionNone, sarama.CompressionGZIP, sarama.CompressionSnappy,
		sarama.CompressionLZ4, sarama.CompressionZSTD}
	codec, err := bridge.Choice(s, "compression.type", 0, bridge.Indexes(bridge.CompressionType))
	if err != nil {
		return nil, nil, err
	}
	p.Compression = codecs[codec]
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
	committed, err := bridge.Choice(s, "isolation.level", false, bridge.ReadCommitted)
	if err != nil {
		return out, err
	}
	if committed {
		c.IsolationLevel = sarama.ReadCommitted
	}
	latest, err := bridge.Choice(s, "auto.offset.reset", false, bridge.Latest)
	if err != nil {
		return out, err
	}
	if latest {
		c.Offsets.Initial = sarama.OffsetNewest
	}
	if c.Offsets.AutoCommit.Enable, err = bridge.Choice(s, "enable.auto.commit", false, bridge.TrueFalse); err != nil {
		return out, err
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

func (lib) Producer(s *bridge.Settings) (bridge.Producer, error) {
	addrs, cfg, err := producerConfig(s)
	if err == nil {
		err = validate(cfg)
	}
	if err != nil {
		return nil, err
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
}

func (lib) Consumer(s *bridge.Settings) (bridge.Consumer, error) {
	cs, err := consumerConfig(s)
	if err == nil {
		err = validate(cs.cfg)
	}
	if err != nil {
		return nil, err
	}
	return newConsumer(cs)
}

func (lib) Admin(s *bridge.Settings) (bridge.Admin, error) {
	addrs, cfg, err := config(s)
	if err == nil {
		err = s.Unknown("sarama's admin client")
	}
	if err != nil {
		return nil, err
	}
	admin, err := sarama.NewClusterAdmin(addrs, cfg)
	if err != nil {
		return nil, err
	}
	return &adminClient{admin}, nil
}

// validate is sarama's own check of the settings together (an idempotent producer needs acks=all, ...).
func validate(cfg *sarama.Config) error {
	if err := cfg.Validate(); err != nil {
		return bridge.Bad(err.Error())
	}
	return nil
}

// --- the producer ------------------------------------------------------------------------

type producer struct {
	client     sarama.Client
	async      sarama.AsyncProducer
	deliveries *bridge.Deliveries
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
	bridge.Within(timeout, func() { p.async.Close() })
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

// InitTransactions has nothing left to do: the producer sent InitProducerId when it was built.
func (p *producer) InitTransactions(time.Duration) error {
	if !p.async.IsTransactional() {
		return p.txnFailure(sarama.ErrNonTransactedProducer)
	}
	return nil
}

func (p *producer) Begin() error { return p.txnFailure(p.async.BeginTxn()) }

func (p *producer) Send(id int64, topic string, partition int32, key, value []byte) {
	msg := &sarama.ProducerMessage{Topic: topic, Partition: partition, Metadata: id}
	if key != nil {
		msg.Key = sarama.ByteEncoder(key)
	}
	if value != nil {
		msg.Value = sarama.ByteEncoder(value)
	}
	p.deliveries.Start()
	p.async.Input() <- msg
}

// Flush waits for the outcomes: sarama sends at once (Producer.Flush.Frequency 0) and has no flush of its own.
func (p *producer) Flush(timeout time.Duration) { p.deliveries.Wait(timeout) }

func (p *producer) SendOffsets(c bridge.Client, offsets map[bridge.TP]int64, _ time.Duration) error {
	byTopic := map[string][]*sarama.PartitionOffsetMetadata{}
	for topic, parts := range bridge.GroupOffsets(offsets) {
		for partition, offset := range parts {
			byTopic[topic] = append(byTopic[topic], &sarama.PartitionOffsetMetadata{Partition: partition, Offset: offset})
		}
	}
	return p.txnFailure(p.async.AddOffsetsToTxnWithGroupMetadata(byTopic, c.(*consumer).groupMetadata()))
}

func (p *producer) End(commit bool, timeout time.Duration) error {
	var err error
	if commit {
		err = p.async.CommitTxn() // flushes first
	} else {
		err = p.async.AbortTxn()
	}
	p.deliveries.Wait(timeout) // every outcome is out before the reply
	return p.txnFailure(err)
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
	reading  *bridge.Reading

	mu          sync.Mutex
	partitions  sarama.Consumer // assign mode
	readers     map[bridge.TP]reader
	generations map[bridge.TP]int64
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
		reading: bridge.NewReading(), readers: map[bridge.TP]reader{}, generations: map[bridge.TP]int64{}}, nil
}

func (c *consumer) Reading() *bridge.Reading { return c.reading }

func (c *consumer) Close(clean bool, timeout time.Duration) {
	if !clean {
		c.client.Close() // no LeaveGroup, no commit: a crash
	}
	bridge.Within(timeout, func() {
		c.stop()
		c.client.Close()
	})
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

func (c *consumer) Assign(partitions []bridge.TP, offsets map[bridge.TP]int64, timeout time.Duration) error {
	c.mu.Lock()
	subscribed := c.group != nil
	c.mu.Unlock()
	if subscribed {
		c.stop()
	}
	starts, err := bridge.StartOffsets(c, partitions, offsets, timeout)
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
	for _, tp := range partitions {
		start, ok := starts[tp]
		if !ok {
			start = c.settings.cfg.Consumer.Offsets.Initial
		}
		if err := c.read(tp, start); err != nil {
			return err
		}
	}
	c.reading.Reset(partitions, starts)
	return nil
}

func (c *consumer) Seek(tp bridge.TP, offset int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.group != nil {
		// A claim reads on from where the session started it; sarama has no seek for it.
		return &bridge.Failure{Name: "SeekUnsupported", Message: "sarama's consumer group cannot seek a claimed partition"}
	}
	if !c.reading.Holds(tp) {
		return bridge.Badf("seek on %s-%d, which is not assigned", tp.Topic, tp.Partition)
	}
	c.reading.At(tp, offset)
	return c.read(tp, offset)
}

// handler feeds the claims of a consumer group session into the poll queue.
type handler struct{ c *consumer }

func (h handler) Setup(s sarama.ConsumerGroupSession) error {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	h.c.session = s
	var claimed []bridge.TP
	for topic, ps := range s.Claims() {
		for _, p := range ps {
			tp := bridge.TP{Topic: topic, Partition: p}
			claimed = append(claimed, tp)
			h.c.next++
			h.c.generations[tp] = h.c.next
		}
	}
	h.c.reading.Reset(claimed, nil)
	return nil
}

func (h handler) Cleanup(sarama.ConsumerGroupSession) error {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	h.c.session = nil
	for _, tp := range h.c.reading.Held() {
		h.c.generations[tp] = -1
	}
	h.c.reading.Reset(nil, nil)
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

func (c *consumer) Subscribe(topics []string) error {
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
				if errors.Is(err, sarama.ErrClosedConsumerGroup) || ctx.Err() != nil {
					return // stopped: a resubscription or the close, not a failure of a poll
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
	current := c.generations[tp] == rec.generation
	c.mu.Unlock()
	if !current {
		return // read before a seek or a reassignment
	}
	m := rec.msg
	*out = append(*out, []any{m.Topic, m.Partition, m.Offset, bridge.B64(m.Key), bridge.B64(m.Value)})
	c.reading.At(tp, m.Offset+1)
}

func (c *consumer) Poll(maxRecords int, timeout time.Duration) ([]any, error) {
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

func (c *consumer) Commit(offsets map[bridge.TP]int64, timeout time.Duration) error {
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

func (c *consumer) Committed(partitions []bridge.TP, timeout time.Duration) (map[bridge.TP]int64, error) {
	found := map[bridge.TP]int64{}
	if len(partitions) == 0 || c.settings.group == "" {
		return found, nil
	}
	req := sarama.NewOffsetFetchRequest(c.settings.cfg.Version, c.settings.group, bridge.GroupPartitions(partitions))
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

func (a *adminClient) CreateTopics(topics []bridge.TP, _ time.Duration) error {
	for _, item := range topics {
		detail := &sarama.TopicDetail{NumPartitions: item.Partition, ReplicationFactor: -1} // the cluster's default
		if err := a.admin.CreateTopic(item.Topic, detail, false); err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return err
		}
	}
	return nil
}

// --- errors ------------------------------------------------------------------------------------

// clientErrors are sarama's own errors.
var clientErrors = []bridge.ClientError{
	{Err: sarama.ErrTransactionNotReady, Name: "ErrTransactionNotReady", Unsent: true},
	{Err: sarama.ErrNonTransactedProducer, Name: "ErrNonTransactedProducer", Unsent: true},
	{Err: sarama.ErrShuttingDown, Name: "ErrShuttingDown", Unsent: true},
	{Err: sarama.ErrTxnOffsetCommit, Name: "ErrTxnOffsetCommit"},
	{Err: sarama.ErrOutOfBrokers, Name: "ErrOutOfBrokers", Retriable: true},
	{Err: sarama.ErrNotConnected, Name: "ErrNotConnected", Retriable: true},
	{Err: sarama.ErrClosedClient, Name: "ErrClosedClient"},
	{Err: sarama.ErrClosedConsumerGroup, Name: "ErrClosedConsumerGroup"},
}

// kafkaCode finds the Kafka error code sarama wraps.
func kafkaCode(err error) (int16, bool) {
	var code sarama.KError
	if errors.As(err, &code) {
		return int16(code), true
	}
	return 0, false
}

// classify is the workload's reading of a sarama error (docs/workload.md, "Errors").
func classify(err error, enqueued bool) bridge.Failure {
	var config sarama.ConfigurationError
	if errors.As(err, &config) { // a record the producer refused to send (too large, ...)
		return bridge.Failure{Name: "ConfigurationError", Abort: true, Message: err.Error()}
	}
	return bridge.Classify(err, enqueued, kafkaCode, clientErrors, "SaramaError")
}

func (lib) Failure(err error, enqueued bool) bridge.Failure { return classify(err, enqueued) }
