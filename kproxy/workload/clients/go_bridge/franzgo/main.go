// franz-go (github.com/twmb/franz-go, pkg/kgo) driven by kproxy's workload
// through the client bridge protocol (package bridge, docs/workload.md).
//
// A producer is a plain kgo client with a transactional id (not a
// GroupTransactSession: the workload's consumer is a client of its own, and
// by default assigns partitions, which a kgo group consumer cannot). franz-go
// chooses transaction version 2 (KIP-890 part 2) itself when the broker allows
// it. kgo has no API for committing another client's offsets into a
// transaction, so send_offsets sends what franz-go's GroupTransactSession
// would: AddOffsetsToTxn (before transaction version 2 only) and
// TxnOffsetCommit, through the producer's client, at the versions kgo pins.
package main

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"kproxy.local/gobridge/bridge"
)

func main() { bridge.Run(franz{}) }

type franz struct{}

// --- settings ------------------------------------------------------------------------

// common maps the settings every client takes; what it leaves is the producer's or consumer's own.
func common(s *bridge.Settings) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	servers, ok := s.Get("bootstrap.servers")
	if !ok {
		return nil, bridge.Bad("bootstrap.servers is required")
	}
	opts = append(opts, kgo.SeedBrokers(strings.Split(servers, ",")...))
	if v, ok := s.Get("client.id"); ok {
		opts = append(opts, kgo.ClientID(v))
	}
	if v, ok := s.Get("security.protocol"); ok && !strings.EqualFold(v, "PLAINTEXT") {
		return nil, bridge.Badf("security.protocol=%s: the franz-go client of the workload speaks PLAINTEXT only", v)
	}
	return opts, nil
}

func producerOpts(s *bridge.Settings) ([]kgo.Opt, time.Duration, error) {
	opts, err := common(s)
	if err != nil {
		return nil, 0, err
	}
	opts = append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if v, ok := s.Get("transactional.id"); ok {
		opts = append(opts, kgo.TransactionalID(v))
	}
	idempotent, err := bridge.Choice(s, "enable.idempotence", true, bridge.TrueFalse)
	if err != nil {
		return nil, 0, err
	}
	if !idempotent {
		opts = append(opts, kgo.DisableIdempotentWrite())
	}
	acks, err := bridge.Choice(s, "acks", -1, bridge.Acks)
	if err != nil {
		return nil, 0, err
	}
	opts = append(opts, kgo.RequiredAcks(map[int16]kgo.Acks{-1: kgo.AllISRAcks(), 1: kgo.LeaderAck(), 0: kgo.NoAck()}[acks]))
	durations := []struct {
		key string
		opt func(time.Duration) kgo.Opt
	}{
		{"request.timeout.ms", func(d time.Duration) kgo.Opt { return kgo.ProduceRequestTimeout(d) }},
		{"delivery.timeout.ms", func(d time.Duration) kgo.Opt { return kgo.RecordDeliveryTimeout(d) }},
		{"transaction.timeout.ms", func(d time.Duration) kgo.Opt { return kgo.TransactionTimeout(d) }},
		{"linger.ms", func(d time.Duration) kgo.Opt { return kgo.ProducerLinger(d) }},
		{"retry.backoff.ms", func(d time.Duration) kgo.Opt { return kgo.RetryBackoffFn(func(int) time.Duration { return d }) }},
	}
	for _, d := range durations {
		v, ok, err := s.Millis(d.key)
		if err != nil {
			return nil, 0, err
		}
		if ok {
			opts = append(opts, d.opt(v))
		}
	}
	if v, ok := s.Get("retries"); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, 0, bridge.Badf("retries=%s is not a number", v)
		}
		opts = append(opts, kgo.RecordRetries(n))
	}
	if v, ok := s.Get("max.in.flight.requests.per.connection"); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, 0, bridge.Badf("max.in.flight.requests.per.connection=%s is not a number", v)
		}
		opts = append(opts, kgo.MaxProduceRequestsInflightPerBroker(n))
	}
	codecs := []kgo.CompressionCodec{kgo.NoCompression(), kgo.GzipCompression(), kgo.SnappyCompression(),
		kgo.Lz4Compression(), kgo.ZstdCompression()}
	codec, err := bridge.Choice(s, "compression.type", -1, bridge.Indexes(bridge.CompressionType))
	if err != nil {
		return nil, 0, err
	}
	if codec >= 0 {
		opts = append(opts, kgo.ProducerBatchCompression(codecs[codec]))
	}
	block, ok, err := s.Millis("max.block.ms")
	if err != nil {
		return nil, 0, err
	}
	if !ok {
		block = 0
	}
	return opts, block, s.Unknown("franz-go's producer")
}

type consumerSettings struct {
	opts      []kgo.Opt
	groupOpts []kgo.Opt
	group     string
	reset     kgo.Offset
	auto      bool
}

func consumerOpts(s *bridge.Settings) (consumerSettings, error) {
	opts, err := common(s)
	if err != nil {
		return consumerSettings{}, err
	}
	out := consumerSettings{reset: kgo.NewOffset().AtStart()}
	out.group, _ = s.Get("group.id")
	committed, err := bridge.Choice(s, "isolation.level", false, bridge.ReadCommitted)
	if err != nil {
		return out, err
	}
	if committed {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	latest, err := bridge.Choice(s, "auto.offset.reset", false, bridge.Latest)
	if err != nil {
		return out, err
	}
	if latest {
		out.reset = kgo.NewOffset().AtEnd()
	}
	opts = append(opts, kgo.ConsumeResetOffset(out.reset))
	if out.auto, err = bridge.Choice(s, "enable.auto.commit", false, bridge.TrueFalse); err != nil {
		return out, err
	}
	durations := []struct {
		key   string
		group bool // an option of group consumers only
		opt   func(time.Duration) kgo.Opt
	}{
		{"fetch.max.wait.ms", false, func(d time.Duration) kgo.Opt { return kgo.FetchMaxWait(d) }},
		{"session.timeout.ms", true, func(d time.Duration) kgo.Opt { return kgo.SessionTimeout(d) }},
		{"heartbeat.interval.ms", true, func(d time.Duration) kgo.Opt { return kgo.HeartbeatInterval(d) }},
		{"auto.commit.interval.ms", true, func(d time.Duration) kgo.Opt { return kgo.AutoCommitInterval(d) }},
	}
	for _, d := range durations {
		v, ok, err := s.Millis(d.key)
		if err != nil {
			return out, err
		}
		if ok && d.group {
			out.groupOpts = append(out.groupOpts, d.opt(v))
		} else if ok {
			opts = append(opts, d.opt(v))
		}
	}
	out.opts = opts
	return out, s.Unknown("franz-go's consumer")
}

// --- opening clients -------------------------------------------------------------------

func (franz) Producer(s *bridge.Settings) (bridge.Producer, error) {
	opts, block, err := producerOpts(s)
	if err != nil {
		return nil, err
	}
	p := &producer{opts: opts, block: block, deliveries: bridge.NewDeliveries()}
	p.txnID, _ = s.Get("transactional.id")
	return p, p.open()
}

// Consumer builds its kgo client at the first assign or subscribe, which decide what kind it is.
func (franz) Consumer(s *bridge.Settings) (bridge.Consumer, error) {
	cs, err := consumerOpts(s)
	return &consumer{settings: cs, reading: bridge.NewReading()}, err
}

func (franz) Admin(s *bridge.Settings) (bridge.Admin, error) {
	opts, err := common(s)
	if err == nil {
		err = s.Unknown("franz-go's admin client")
	}
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, bridge.Bad(err.Error())
	}
	return &admin{cl}, nil
}

// withCancel is a client whose crash cancels its context first, so that Close leaves no group and ends nothing.
type withCancel struct {
	cl     *kgo.Client
	cancel context.CancelFunc
}

func newClient(opts []kgo.Opt) (withCancel, error) {
	ctx, cancel := context.WithCancel(context.Background())
	cl, err := kgo.NewClient(append(opts, kgo.WithContext(ctx))...)
	if err != nil {
		cancel()
		return withCancel{}, bridge.Bad(err.Error())
	}
	return withCancel{cl, cancel}, nil
}

func (w withCancel) close(clean bool, timeout time.Duration) {
	if w.cl == nil {
		return
	}
	if !clean {
		w.cancel()
		w.cl.Close()
		return
	}
	if !bridge.Within(timeout, w.cl.Close) {
		w.cancel() // Close then gives up on the group's LeaveGroup and returns
	}
	w.cancel()
}

// --- the producer ----------------------------------------------------------------------

type producer struct {
	opts       []kgo.Opt
	block      time.Duration // max.block.ms: bounds the transactional calls when set
	txnID      string
	client     withCancel
	deliveries *bridge.Deliveries
	tv2        *bool

	mu          sync.Mutex
	sentInTxn   bool            // a record was handed to franz-go in this transaction
	landedInTxn bool            // a record of this transaction was acknowledged: franz-go added its partition
	failedInTxn *bridge.Failure // the first send of this transaction that failed
	offsetsSent bool            // send_offsets added offsets to this transaction
}

func (p *producer) open() (err error) {
	p.client, err = newClient(p.opts)
	return err
}

func (p *producer) Close(clean bool, timeout time.Duration) {
	if clean {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		p.client.cl.Flush(ctx)
		cancel()
	}
	p.client.close(clean, timeout)
}

// ctx bounds a transactional call by its timeout, or by max.block.ms when that is shorter.
func (p *producer) ctx(timeout time.Duration) (context.Context, context.CancelFunc) {
	if p.block > 0 && p.block < timeout {
		timeout = p.block
	}
	return context.WithTimeout(context.Background(), timeout)
}

// InitTransactions sends InitProducerId now, fencing a predecessor, as the Java client does
// (franz-go alone would wait for the first record).
func (p *producer) InitTransactions(timeout time.Duration) error {
	ctx, cancel := p.ctx(timeout)
	defer cancel()
	_, _, err := p.client.cl.ProducerID(ctx)
	return err
}

func (p *producer) Begin() error {
	p.mu.Lock()
	p.sentInTxn, p.landedInTxn, p.failedInTxn, p.offsetsSent = false, false, nil, false
	p.mu.Unlock()
	return p.client.cl.BeginTransaction()
}

func (p *producer) Send(id int64, topic string, partition int32, key, value []byte) {
	p.mu.Lock()
	p.sentInTxn = true
	p.mu.Unlock()
	p.deliveries.Start()
	rec := &kgo.Record{Topic: topic, Partition: partition, Key: key, Value: value}
	p.client.cl.Produce(context.Background(), rec, func(rec *kgo.Record, err error) {
		if err != nil {
			f := classify(err, true)
			p.mu.Lock()
			if p.failedInTxn == nil {
				p.failedInTxn = &f
			}
			p.mu.Unlock()
			p.deliveries.Done(id, -1, &f)
			return
		}
		p.mu.Lock()
		p.landedInTxn = true
		p.mu.Unlock()
		p.deliveries.Done(id, rec.Offset, nil)
	})
}

func (p *producer) Flush(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	p.flush(ctx)
}

func (p *producer) flush(ctx context.Context) {
	p.client.cl.Flush(ctx) // an error is the deadline: the sends still pending stay without an outcome
	deadline, _ := ctx.Deadline()
	p.deliveries.Wait(max(0, time.Until(deadline)))
}

func (p *producer) SendOffsets(c bridge.Client, offsets map[bridge.TP]int64, timeout time.Duration) error {
	ctx, cancel := p.ctx(timeout)
	defer cancel()
	return p.sendOffsets(ctx, c.(*consumer), offsets)
}

// End commits or aborts; an offsets-only transaction is ended by the program (see endOwn).
func (p *producer) End(commit bool, timeout time.Duration) error {
	ctx, cancel := p.ctx(timeout)
	defer cancel()
	cl := p.client.cl
	if commit {
		p.flush(ctx)
	} else if err := cl.AbortBufferedRecords(ctx); err != nil {
		return err
	}
	tv2, err := p.transactionVersion2(ctx)
	if err != nil {
		return err
	}
	p.mu.Lock()
	// franz-go ends a transaction itself once a record landed, and under transaction version 2 also
	// after records it tried (an abort, clearing what the broker registered); otherwise the offsets
	// alone hold the transaction open, and the program ends it.
	failed, offsetsOnly := p.failedInTxn, p.offsetsSent && !p.landedInTxn && !(tv2 && p.sentInTxn)
	p.mu.Unlock()
	if commit && failed != nil {
		// As the Java client refuses commitTransaction after a failed send: the application must abort.
		return &bridge.Failure{Name: failed.Name, Fatal: failed.Fatal, Abort: !failed.Fatal, Enqueued: true,
			Message: "a send of this transaction failed: " + failed.Message}
	}
	if offsetsOnly {
		return p.endOwn(ctx, commit)
	}
	try := kgo.TryAbort
	if commit {
		try = kgo.TryCommit
	}
	return cl.EndTransaction(ctx, try)
}

// endOwn ends a transaction that holds offsets and no record franz-go knows of. franz-go sends EndTxn only
// for a transaction it added partitions to itself, so the bridge sends it, at the version
// franz-go would. Under transaction version 2 that EndTxn bumps the epoch, which franz-go
// cannot learn: the client is replaced by a new one (InitProducerId again), as an
// application would recover.
func (p *producer) endOwn(ctx context.Context, commit bool) error {
	cl := p.client.cl
	if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil { // leaves franz-go's own transaction state; sends nothing
		return err
	}
	id, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		return err
	}
	tv2, err := p.transactionVersion2(ctx)
	if err != nil {
		return err
	}
	req := kmsg.NewPtrEndTxnRequest()
	req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Commit = p.txnID, id, epoch, commit
	resp, err := coordinated(ctx, cl, 1, p.txnID, req, versionCap(tv2, 4), func(r kmsg.Response) int16 {
		return r.(*kmsg.EndTxnResponse).ErrorCode
	})
	if err != nil {
		return err
	}
	if r := resp.(*kmsg.EndTxnResponse); r.Version >= 5 && r.ProducerEpoch != epoch {
		p.client.close(false, 0)
		if err := p.open(); err != nil {
			return err
		}
		_, _, err := p.client.cl.ProducerID(ctx)
		return err
	}
	return nil
}

// transactionVersion2 is franz-go's own test (supportsKIP890p2): the broker's finalized
// transaction.version is 2 or more and it takes Produce v12, EndTxn v5 and TxnOffsetCommit v5.
func (p *producer) transactionVersion2(ctx context.Context) (bool, error) {
	if p.tv2 != nil {
		return *p.tv2, nil
	}
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, p.client.cl)
	if err != nil {
		return false, err
	}
	feature := false
	for _, f := range resp.FinalizedFeatures {
		if f.Name == "transaction.version" && f.MaxVersionLevel >= 2 {
			feature = true
		}
	}
	maxes := map[int16]int16{}
	for _, k := range resp.ApiKeys {
		maxes[k.ApiKey] = k.MaxVersion
	}
	tv2 := feature && maxes[int16(kmsg.Produce)] >= 12 && maxes[int16(kmsg.EndTxn)] >= 5 &&
		maxes[int16(kmsg.TxnOffsetCommit)] >= 5
	p.tv2 = &tv2
	return tv2, nil
}

func (p *producer) sendOffsets(ctx context.Context, c *consumer, offsets map[bridge.TP]int64) error {
	if p.txnID == "" {
		return bridge.Bad("send_offsets needs a transactional producer")
	}
	if len(offsets) == 0 {
		return nil
	}
	cl := p.client.cl
	id, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		return err
	}
	tv2, err := p.transactionVersion2(ctx)
	if err != nil {
		return err
	}
	group := c.settings.group
	p.mu.Lock()
	added := p.offsetsSent
	p.mu.Unlock()
	if !tv2 && !added {
		add := kmsg.NewPtrAddOffsetsToTxnRequest()
		add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = p.txnID, id, epoch, group
		if _, err := coordinated(ctx, cl, 1, p.txnID, add, 32767, func(r kmsg.Response) int16 {
			return r.(*kmsg.AddOffsetsToTxnResponse).ErrorCode
		}); err != nil {
			return err
		}
	}
	p.mu.Lock()
	p.offsetsSent = true
	p.mu.Unlock()
	member, generation := c.groupMetadata()
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch = p.txnID, group, id, epoch
	req.Generation, req.MemberID = generation, member
	req.Topics = offsetTopics(offsets, func(name string, parts []kmsg.TxnOffsetCommitRequestTopicPartition) kmsg.TxnOffsetCommitRequestTopic {
		t := kmsg.NewTxnOffsetCommitRequestTopic()
		t.Topic, t.Partitions = name, parts
		return t
	}, func(partition int32, offset int64) kmsg.TxnOffsetCommitRequestTopicPartition {
		part := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		part.Partition, part.Offset, part.LeaderEpoch = partition, offset, -1
		return part
	})
	// v6 names topics by id; kgo pins v5 when it has none, and v4 before transaction version 2.
	_, err = coordinated(ctx, cl, 0, group, req, versionCap(tv2, 4, 5), func(r kmsg.Response) int16 {
		return firstCode(r.(*kmsg.TxnOffsetCommitResponse).Topics,
			func(t kmsg.TxnOffsetCommitResponseTopic) []kmsg.TxnOffsetCommitResponseTopicPartition {
				return t.Partitions
			},
			func(p kmsg.TxnOffsetCommitResponseTopicPartition) int16 { return p.ErrorCode })
	})
	return err
}

// offsetTopics builds the topics of an offset request (TxnOffsetCommit, OffsetCommit), each with its own types.
func offsetTopics[T, P any](offsets map[bridge.TP]int64, topic func(string, []P) T, part func(int32, int64) P) []T {
	var out []T
	for name, parts := range bridge.GroupOffsets(offsets) {
		var ps []P
		for partition, offset := range parts {
			ps = append(ps, part(partition, offset))
		}
		out = append(out, topic(name, ps))
	}
	return out
}

// firstCode is the first error code of a response's partitions, each response with its own types.
func firstCode[T, P any](topics []T, partitions func(T) []P, code func(P) int16) int16 {
	for _, t := range topics {
		for _, p := range partitions(t) {
			if c := code(p); c != 0 {
				return c
			}
		}
	}
	return 0
}

func versionCap(tv2 bool, before int16, after ...int16) int16 {
	if !tv2 {
		return before
	}
	if len(after) > 0 {
		return after[0]
	}
	return 32767
}

// capped is a request whose version franz-go may not raise above max.
type capped struct {
	kmsg.Request
	max int16
}

func (c capped) MaxVersion() int16 { return min(c.Request.MaxVersion(), c.max) }

// coordinated sends req to the coordinator of key (type 0 a group, 1 a transactional id), retrying.
func coordinated(ctx context.Context, cl *kgo.Client, kind int8, key string, req kmsg.Request, maxVersion int16,
	code func(kmsg.Response) int16) (resp kmsg.Response, err error) {
	err = retrying(ctx, func() error {
		if resp, err = coordinatedOnce(ctx, cl, kind, key, req, maxVersion); err != nil {
			return err
		}
		return kerr.ErrorForCode(code(resp))
	})
	return resp, err
}

// retrying calls fn again while Kafka calls its error retriable, or answers CONCURRENT_TRANSACTIONS
// (not retriable by Kafka's flag, but the transaction before is still completing: kgo and the Java
// client retry it too), until ctx ends.
func retrying(ctx context.Context, fn func() error) error {
	return bridge.Retrying(ctx, func(err error) bool {
		var ke *kerr.Error
		return errors.As(err, &ke) && (ke.Retriable || ke.Code == kerr.ConcurrentTransactions.Code)
	}, fn)
}

func coordinatedOnce(ctx context.Context, cl *kgo.Client, kind int8, key string, req kmsg.Request,
	maxVersion int16) (kmsg.Response, error) {
	find := kmsg.NewPtrFindCoordinatorRequest()
	find.CoordinatorKey, find.CoordinatorType, find.CoordinatorKeys = key, kind, []string{key}
	found, err := find.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	node, code := found.NodeID, found.ErrorCode
	if len(found.Coordinators) > 0 {
		node, code = found.Coordinators[0].NodeID, found.Coordinators[0].ErrorCode
	}
	if err := kerr.ErrorForCode(code); err != nil {
		return nil, err
	}
	return cl.Broker(int(node)).Request(ctx, capped{req, maxVersion})
}

// --- the consumer ---------------------------------------------------------------------

type consumer struct {
	settings consumerSettings
	client   withCancel
	mode     string // "", "assign" or "subscribe"
	reading  *bridge.Reading
}

func (c *consumer) Close(clean bool, timeout time.Duration) { c.client.close(clean, timeout) }

func (c *consumer) Reading() *bridge.Reading { return c.reading }

func (c *consumer) groupMetadata() (string, int32) {
	if c.mode != "subscribe" {
		return "", -1 // an assigning consumer is no group member: what the Java client sends too
	}
	return c.client.cl.GroupMetadata()
}

// use replaces the client when the consumer changes between assigning and subscribing.
func (c *consumer) use(mode string, opts ...kgo.Opt) error {
	if c.mode == mode {
		return nil
	}
	c.client.close(true, 5*time.Second)
	client, err := newClient(append(append([]kgo.Opt{}, c.settings.opts...), opts...))
	if err != nil {
		return err
	}
	c.client, c.mode = client, mode
	c.reading.Reset(nil, nil)
	return nil
}

func (c *consumer) Assign(partitions []bridge.TP, offsets map[bridge.TP]int64, timeout time.Duration) error {
	if err := c.use("assign"); err != nil {
		return err
	}
	cl := c.client.cl
	old := map[string][]int32{}
	for _, tp := range c.reading.Held() {
		old[tp.Topic] = append(old[tp.Topic], tp.Partition)
	}
	cl.RemoveConsumePartitions(old)
	starts, err := bridge.StartOffsets(c, partitions, offsets, timeout)
	if err != nil {
		return err
	}
	add := map[string]map[int32]kgo.Offset{}
	for _, tp := range partitions {
		start := c.settings.reset
		if o, ok := starts[tp]; ok {
			start = kgo.NewOffset().At(o)
		}
		if add[tp.Topic] == nil {
			add[tp.Topic] = map[int32]kgo.Offset{}
		}
		add[tp.Topic][tp.Partition] = start
	}
	cl.AddConsumePartitions(add)
	c.reading.Reset(partitions, starts)
	return nil
}

func (c *consumer) Subscribe(topics []string) error {
	if c.settings.group == "" {
		return bridge.Bad("subscribe needs group.id")
	}
	if c.mode == "subscribe" {
		now := map[string]bool{}
		for _, t := range topics {
			now[t] = true
		}
		var gone []string
		for _, t := range c.client.cl.GetConsumeTopics() {
			if !now[t] {
				gone = append(gone, t)
			}
		}
		c.client.cl.PurgeTopicsFromConsuming(gone...)
		c.client.cl.AddConsumeTopics(topics...)
		return nil
	}
	held := func(held bool) func(context.Context, *kgo.Client, map[string][]int32) {
		return func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			var tps []bridge.TP
			for t, ps := range m {
				for _, p := range ps {
					tps = append(tps, bridge.TP{Topic: t, Partition: p})
				}
			}
			c.reading.Hold(tps, held)
		}
	}
	opts := []kgo.Opt{kgo.ConsumerGroup(c.settings.group), kgo.ConsumeTopics(topics...),
		kgo.OnPartitionsAssigned(held(true)), kgo.OnPartitionsRevoked(held(false)), kgo.OnPartitionsLost(held(false))}
	if !c.settings.auto {
		opts = append(opts, kgo.DisableAutoCommit())
	}
	return c.use("subscribe", append(opts, c.settings.groupOpts...)...)
}

func (c *consumer) Seek(tp bridge.TP, offset int64) error {
	if c.client.cl != nil {
		c.client.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{tp.Topic: {tp.Partition: {Epoch: -1, Offset: offset}}})
	}
	c.reading.At(tp, offset)
	return nil
}

func (c *consumer) Poll(maxRecords int, timeout time.Duration) ([]any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out := []any{}
	if c.client.cl == nil {
		<-ctx.Done()
		return out, nil
	}
	fetches := c.client.cl.PollRecords(ctx, maxRecords) // keeps what is beyond maxRecords for the next poll
	var failure error
	fetches.EachError(func(_ string, _ int32, err error) {
		// The poll's own deadline, and what kgo retries itself (a topic whose metadata is not out yet), fail nothing.
		var ke *kerr.Error
		retried := errors.As(err, &ke) && ke.Retriable
		if failure == nil && !retried && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			failure = err
		}
	})
	fetches.EachRecord(func(rec *kgo.Record) {
		out = append(out, []any{rec.Topic, rec.Partition, rec.Offset, bridge.B64(rec.Key), bridge.B64(rec.Value)})
		c.reading.At(bridge.TP{Topic: rec.Topic, Partition: rec.Partition}, rec.Offset+1)
	})
	if len(out) == 0 && failure != nil {
		return nil, failure
	}
	return out, nil
}

func (c *consumer) Commit(offsets map[bridge.TP]int64, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if c.client.cl == nil {
		return bridge.Bad("commit before assign or subscribe")
	}
	member, generation := c.groupMetadata()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.Generation, req.MemberID = c.settings.group, generation, member
	req.Topics = offsetTopics(offsets, func(name string, parts []kmsg.OffsetCommitRequestTopicPartition) kmsg.OffsetCommitRequestTopic {
		t := kmsg.NewOffsetCommitRequestTopic()
		t.Topic, t.Partitions = name, parts
		return t
	}, func(partition int32, offset int64) kmsg.OffsetCommitRequestTopicPartition {
		part := kmsg.NewOffsetCommitRequestTopicPartition()
		part.Partition, part.Offset, part.LeaderEpoch = partition, offset, -1
		return part
	})
	// v10 names topics by id, which a client that never fetched a topic's metadata lacks: v9, as kgo pins it.
	_, err := coordinated(ctx, c.client.cl, 0, c.settings.group, req, 9, func(r kmsg.Response) int16 {
		return firstCode(r.(*kmsg.OffsetCommitResponse).Topics,
			func(t kmsg.OffsetCommitResponseTopic) []kmsg.OffsetCommitResponseTopicPartition { return t.Partitions },
			func(p kmsg.OffsetCommitResponseTopicPartition) int16 { return p.ErrorCode })
	})
	return err
}

func (c *consumer) Committed(partitions []bridge.TP, timeout time.Duration) (map[bridge.TP]int64, error) {
	found := map[bridge.TP]int64{}
	cl := c.client.cl
	if cl == nil || c.settings.group == "" || len(partitions) == 0 {
		return found, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = c.settings.group
	req.RequireStable = true
	for topic, parts := range bridge.GroupPartitions(partitions) {
		t := kmsg.NewOffsetFetchRequestTopic()
		t.Topic, t.Partitions = topic, parts
		req.Topics = append(req.Topics, t)
	}
	// v8 asks for many groups and v10 names topics by id: v7, one group by name, with RequireStable.
	resp, err := coordinated(ctx, cl, 0, c.settings.group, req, 7, func(r kmsg.Response) int16 {
		resp := r.(*kmsg.OffsetFetchResponse)
		if resp.ErrorCode != 0 {
			return resp.ErrorCode
		}
		return firstCode(resp.Topics,
			func(t kmsg.OffsetFetchResponseTopic) []kmsg.OffsetFetchResponseTopicPartition { return t.Partitions },
			func(p kmsg.OffsetFetchResponseTopicPartition) int16 { return p.ErrorCode })
	})
	if err != nil {
		return nil, err
	}
	for _, t := range resp.(*kmsg.OffsetFetchResponse).Topics {
		for _, part := range t.Partitions {
			if part.Offset >= 0 {
				found[bridge.TP{Topic: t.Topic, Partition: part.Partition}] = part.Offset
			}
		}
	}
	return found, nil
}

// --- the admin client ------------------------------------------------------------------

type admin struct{ cl *kgo.Client }

func (a *admin) Close(bool, time.Duration) { a.cl.Close() }

func (a *admin) CreateTopics(topics []bridge.TP, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, time.Second))
	defer cancel()
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = int32(timeout.Milliseconds())
	for _, item := range topics {
		t := kmsg.NewCreateTopicsRequestTopic()
		t.Topic, t.NumPartitions, t.ReplicationFactor = item.Topic, item.Partition, -1 // the cluster's default replication
		req.Topics = append(req.Topics, t)
	}
	resp, err := req.RequestWith(ctx, a.cl)
	if err != nil {
		return err
	}
	for _, t := range resp.Topics {
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return err
		}
	}
	return nil
}

// --- errors ----------------------------------------------------------------------------

// clientErrors are franz-go's own errors.
var clientErrors = []bridge.ClientError{
	{Err: kgo.ErrRecordTimeout, Name: "ErrRecordTimeout", Retriable: true},
	{Err: kgo.ErrRecordRetries, Name: "ErrRecordRetries", Retriable: true},
	{Err: kgo.ErrMaxBuffered, Name: "ErrMaxBuffered", Retriable: true, Unsent: true},
	{Err: kgo.ErrAborting, Name: "ErrAborting"},
	{Err: kgo.ErrClientClosed, Name: "ErrClientClosed"},
	{Err: context.Canceled, Name: "Canceled"},
}

// kafkaCode finds the Kafka error code franz-go wraps.
func kafkaCode(err error) (int16, bool) {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Code, true
	}
	return 0, false
}

// classify is the workload's reading of a franz-go error (docs/workload.md, "Errors").
func classify(err error, enqueued bool) bridge.Failure {
	f := bridge.Classify(err, enqueued, kafkaCode, clientErrors, "KgoError")
	if f.Name == "KgoError" && strings.Contains(err.Error(), "not in a transaction") {
		f.Name, f.Enqueued = "NotInTransaction", false // kgo's errNotInTransaction is not exported
	}
	return f
}

func (franz) Failure(err error, enqueued bool) bridge.Failure { return classify(err, enqueued) }
