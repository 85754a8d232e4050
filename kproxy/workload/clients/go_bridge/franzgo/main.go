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
	idempotent := true
	if v, ok := s.Get("enable.idempotence"); ok {
		idempotent = v == "true"
	}
	if !idempotent {
		opts = append(opts, kgo.DisableIdempotentWrite())
	}
	if v, ok := s.Get("acks"); ok {
		switch v {
		case "all", "-1":
			opts = append(opts, kgo.RequiredAcks(kgo.AllISRAcks()))
		case "1":
			opts = append(opts, kgo.RequiredAcks(kgo.LeaderAck()))
		case "0":
			opts = append(opts, kgo.RequiredAcks(kgo.NoAck()))
		default:
			return nil, 0, bridge.Badf("acks=%s: expected all, -1, 1 or 0", v)
		}
	}
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
	if v, ok := s.Get("compression.type"); ok {
		codec := map[string]kgo.CompressionCodec{"none": kgo.NoCompression(), "gzip": kgo.GzipCompression(),
			"snappy": kgo.SnappyCompression(), "lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression()}
		c, known := codec[v]
		if !known {
			return nil, 0, bridge.Badf("compression.type=%s: expected none, gzip, snappy, lz4 or zstd", v)
		}
		opts = append(opts, kgo.ProducerBatchCompression(c))
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
	isolation := "read_uncommitted"
	if v, ok := s.Get("isolation.level"); ok {
		isolation = v
	}
	switch isolation {
	case "read_committed":
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	case "read_uncommitted":
	default:
		return out, bridge.Badf("isolation.level=%s: expected read_committed or read_uncommitted", isolation)
	}
	if v, ok := s.Get("auto.offset.reset"); ok {
		switch v {
		case "earliest":
		case "latest":
			out.reset = kgo.NewOffset().AtEnd()
		default:
			return out, bridge.Badf("auto.offset.reset=%s: expected earliest or latest", v)
		}
	}
	opts = append(opts, kgo.ConsumeResetOffset(out.reset))
	if v, ok := s.Get("enable.auto.commit"); ok {
		out.auto = v == "true"
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

func (franz) Open(op string, r bridge.Req) (bridge.Client, error) {
	s := bridge.NewSettings(r.Config("config"))
	switch op {
	case "producer":
		opts, block, err := producerOpts(s)
		if err != nil {
			return nil, err
		}
		p := &producer{opts: opts, block: block, deliveries: bridge.NewDeliveries()}
		if v, ok := s.Get("transactional.id"); ok {
			p.txnID = v
		}
		return p, p.open()
	case "consumer":
		cs, err := consumerOpts(s)
		if err != nil {
			return nil, err
		}
		return &consumer{settings: cs, positions: map[bridge.TP]int64{}, assigned: map[bridge.TP]bool{}}, nil
	default: // admin
		opts, err := common(s)
		if err != nil {
			return nil, err
		}
		if err := s.Unknown("franz-go's admin client"); err != nil {
			return nil, err
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return nil, bridge.Bad(err.Error())
		}
		return &admin{cl}, nil
	}
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
	done := make(chan struct{})
	go func() { w.cl.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		w.cancel()
		<-done
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

func (p *producer) ctx(r bridge.Req) (context.Context, context.CancelFunc) {
	timeout := r.Seconds("timeout")
	if p.block > 0 && (timeout == 0 || p.block < timeout) {
		timeout = p.block
	}
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	return context.WithTimeout(context.Background(), timeout)
}

func (franz) Call(op string, r bridge.Req, c bridge.Client) (any, error) {
	switch c := c.(type) {
	case *producer:
		return c.call(op, r)
	case *consumer:
		return c.call(op, r)
	case *admin:
		return c.call(op, r)
	}
	return nil, bridge.Badf("unknown client")
}

func (p *producer) call(op string, r bridge.Req) (any, error) {
	cl := p.client.cl
	ctx, cancel := p.ctx(r)
	defer cancel()
	switch op {
	case "init_transactions":
		_, _, err := cl.ProducerID(ctx) // InitProducerId now, fencing a predecessor, as the Java client does
		return nil, err
	case "begin":
		p.mu.Lock()
		p.sentInTxn, p.failedInTxn, p.offsetsSent = false, nil, false
		p.mu.Unlock()
		return nil, cl.BeginTransaction()
	case "send":
		p.send(r)
		return nil, nil
	case "flush":
		p.flush(ctx, r.Seconds("timeout"))
		return nil, nil
	case "send_offsets":
		cons, _ := bridge.Lookup(r, "consumer").(*consumer)
		if cons == nil {
			return nil, bridge.Bad("send_offsets names no open consumer")
		}
		return nil, p.sendOffsets(ctx, cons, r.Offsets("offsets"))
	case "commit", "abort":
		return nil, p.end(ctx, op == "commit")
	}
	return nil, bridge.Badf("unknown op %s for a producer", op)
}

func (p *producer) send(r bridge.Req) {
	id := r.Int("d")
	rec := &kgo.Record{Topic: r.Str("topic"), Partition: int32(r.Int("partition")), Key: r.Bytes("key"), Value: r.Bytes("value")}
	p.mu.Lock()
	p.sentInTxn = true
	p.mu.Unlock()
	p.deliveries.Start()
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
		p.deliveries.Done(id, rec.Offset, nil)
	})
}

func (p *producer) flush(ctx context.Context, timeout time.Duration) {
	start := time.Now()
	p.client.cl.Flush(ctx) // an error is the deadline: the sends still pending stay without an outcome
	p.deliveries.Wait(max(0, timeout-time.Since(start)))
}

// end commits or aborts; an offsets-only transaction is ended by the bridge (see endOwn).
func (p *producer) end(ctx context.Context, commit bool) error {
	cl := p.client.cl
	deadline, _ := ctx.Deadline()
	if commit {
		p.flush(ctx, time.Until(deadline))
	} else if err := cl.AbortBufferedRecords(ctx); err != nil {
		return err
	}
	p.mu.Lock()
	failed, offsetsOnly := p.failedInTxn, p.offsetsSent && !p.sentInTxn
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

// endOwn ends a transaction that holds offsets and no record. franz-go sends EndTxn only
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
	byTopic := map[string]*kmsg.TxnOffsetCommitRequestTopic{}
	for tp, offset := range offsets {
		t := byTopic[tp.Topic]
		if t == nil {
			nt := kmsg.NewTxnOffsetCommitRequestTopic()
			nt.Topic = tp.Topic
			t = &nt
			byTopic[tp.Topic] = t
		}
		part := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		part.Partition, part.Offset, part.LeaderEpoch = tp.Partition, offset, -1
		t.Partitions = append(t.Partitions, part)
	}
	for _, t := range byTopic {
		req.Topics = append(req.Topics, *t)
	}
	// v6 names topics by id; kgo pins v5 when it has none, and v4 before transaction version 2.
	resp, err := coordinated(ctx, cl, 0, group, req, versionCap(tv2, 4, 5), func(kmsg.Response) int16 { return 0 })
	if err != nil {
		return err
	}
	for _, t := range resp.(*kmsg.TxnOffsetCommitResponse).Topics {
		for _, part := range t.Partitions {
			if err := kerr.ErrorForCode(part.ErrorCode); err != nil {
				return err
			}
		}
	}
	return nil
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

// retrying calls fn again while Kafka calls its error retriable, until ctx ends.
func retrying(ctx context.Context, fn func() error) error {
	return bridge.Retrying(ctx, func(err error) bool {
		var ke *kerr.Error
		return errors.As(err, &ke) && ke.Retriable
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

	mu        sync.Mutex
	positions map[bridge.TP]int64
	assigned  map[bridge.TP]bool
}

func (c *consumer) Close(clean bool, timeout time.Duration) { c.client.close(clean, timeout) }

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
	c.mu.Lock()
	c.positions, c.assigned = map[bridge.TP]int64{}, map[bridge.TP]bool{}
	c.mu.Unlock()
	return nil
}

func (c *consumer) call(op string, r bridge.Req) (any, error) {
	timeout := r.Seconds("timeout")
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	switch op {
	case "assign":
		return nil, c.assign(ctx, r.Partitions("partitions"), r.Offsets("offsets"))
	case "subscribe":
		return nil, c.subscribe(r.Strings("topics"))
	case "poll":
		return c.poll(ctx, int(r.Int("max")))
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
		return nil, c.commit(ctx, r.Offsets("offsets"))
	case "committed":
		found, err := c.committed(ctx, r.Partitions("partitions"))
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
		offset := r.Int("offset")
		if c.client.cl != nil {
			c.client.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{tp.Topic: {tp.Partition: {Epoch: -1, Offset: offset}}})
		}
		c.mu.Lock()
		c.positions[tp] = offset
		c.mu.Unlock()
		return nil, nil
	}
	return nil, bridge.Badf("unknown op %s for a consumer", op)
}

func (c *consumer) assign(ctx context.Context, partitions []bridge.TP, offsets map[bridge.TP]int64) error {
	if err := c.use("assign"); err != nil {
		return err
	}
	cl := c.client.cl
	c.mu.Lock()
	old := map[string][]int32{}
	for tp := range c.assigned {
		old[tp.Topic] = append(old[tp.Topic], tp.Partition)
	}
	c.mu.Unlock()
	cl.RemoveConsumePartitions(old)
	// Where the Java client starts an assigned partition: the offset given, else the group's committed one.
	var missing []bridge.TP
	for _, tp := range partitions {
		if _, ok := offsets[tp]; !ok {
			missing = append(missing, tp)
		}
	}
	committed := map[bridge.TP]int64{}
	if len(missing) > 0 && c.settings.group != "" {
		var err error
		if committed, err = c.committed(ctx, missing); err != nil {
			return err
		}
	}
	add := map[string]map[int32]kgo.Offset{}
	positions, assigned := map[bridge.TP]int64{}, map[bridge.TP]bool{}
	for _, tp := range partitions {
		start := c.settings.reset
		if o, ok := offsets[tp]; ok {
			start, positions[tp] = kgo.NewOffset().At(o), o
		} else if o, ok := committed[tp]; ok {
			start, positions[tp] = kgo.NewOffset().At(o), o
		}
		if add[tp.Topic] == nil {
			add[tp.Topic] = map[int32]kgo.Offset{}
		}
		add[tp.Topic][tp.Partition] = start
		assigned[tp] = true
	}
	cl.AddConsumePartitions(add)
	c.mu.Lock()
	c.positions, c.assigned = positions, assigned
	c.mu.Unlock()
	return nil
}

func (c *consumer) subscribe(topics []string) error {
	if c.settings.group == "" {
		return bridge.Bad("subscribe needs group.id")
	}
	opts := []kgo.Opt{kgo.ConsumerGroup(c.settings.group), kgo.ConsumeTopics(topics...),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) { c.track(m, true) }),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, m map[string][]int32) { c.track(m, false) }),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, m map[string][]int32) { c.track(m, false) })}
	if !c.settings.auto {
		opts = append(opts, kgo.DisableAutoCommit())
	}
	opts = append(opts, c.settings.groupOpts...)
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
	return c.use("subscribe", opts...)
}

func (c *consumer) track(m map[string][]int32, assigned bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, ps := range m {
		for _, p := range ps {
			tp := bridge.TP{Topic: t, Partition: p}
			if assigned {
				c.assigned[tp] = true
			} else {
				delete(c.assigned, tp)
				delete(c.positions, tp)
			}
		}
	}
}

func (c *consumer) poll(ctx context.Context, maxRecords int) (any, error) {
	out := []any{}
	if c.client.cl == nil {
		<-ctx.Done()
		return out, nil
	}
	fetches := c.client.cl.PollRecords(ctx, maxRecords)
	var failure error
	fetches.EachError(func(_ string, _ int32, err error) {
		if failure == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			failure = err
		}
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	fetches.EachRecord(func(rec *kgo.Record) {
		out = append(out, []any{rec.Topic, rec.Partition, rec.Offset, bridge.B64(rec.Key), bridge.B64(rec.Value)})
		c.positions[bridge.TP{Topic: rec.Topic, Partition: rec.Partition}] = rec.Offset + 1
	})
	if len(out) == 0 && failure != nil {
		return nil, failure
	}
	return out, nil
}

func (c *consumer) commit(ctx context.Context, offsets map[bridge.TP]int64) error {
	if len(offsets) == 0 {
		return nil
	}
	if c.client.cl == nil {
		return bridge.Bad("commit before assign or subscribe")
	}
	member, generation := c.groupMetadata()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.Generation, req.MemberID = c.settings.group, generation, member
	byTopic := map[string]int{}
	for tp, offset := range offsets {
		i, ok := byTopic[tp.Topic]
		if !ok {
			t := kmsg.NewOffsetCommitRequestTopic()
			t.Topic = tp.Topic
			req.Topics = append(req.Topics, t)
			i = len(req.Topics) - 1
			byTopic[tp.Topic] = i
		}
		part := kmsg.NewOffsetCommitRequestTopicPartition()
		part.Partition, part.Offset, part.LeaderEpoch = tp.Partition, offset, -1
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, part)
	}
	return retrying(ctx, func() error {
		resp, err := req.RequestWith(ctx, c.client.cl)
		if err != nil {
			return err
		}
		for _, t := range resp.Topics {
			for _, part := range t.Partitions {
				if err := kerr.ErrorForCode(part.ErrorCode); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

func (c *consumer) committed(ctx context.Context, partitions []bridge.TP) (map[bridge.TP]int64, error) {
	found := map[bridge.TP]int64{}
	cl := c.client.cl
	if cl == nil || c.settings.group == "" {
		return found, nil
	}
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = c.settings.group
	req.RequireStable = true
	byTopic := map[string]int{}
	for _, tp := range partitions {
		i, ok := byTopic[tp.Topic]
		if !ok {
			t := kmsg.NewOffsetFetchRequestTopic()
			t.Topic = tp.Topic
			req.Topics = append(req.Topics, t)
			i = len(req.Topics) - 1
			byTopic[tp.Topic] = i
		}
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, tp.Partition)
	}
	err := retrying(ctx, func() error {
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return err
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			return err
		}
		for _, t := range resp.Topics {
			for _, part := range t.Partitions {
				if err := kerr.ErrorForCode(part.ErrorCode); err != nil {
					return err
				}
				if part.Offset >= 0 {
					found[bridge.TP{Topic: t.Topic, Partition: part.Partition}] = part.Offset
				}
			}
		}
		return nil
	})
	return found, err
}

// --- the admin client ------------------------------------------------------------------

type admin struct{ cl *kgo.Client }

func (a *admin) Close(bool, time.Duration) { a.cl.Close() }

func (a *admin) call(op string, r bridge.Req) (any, error) {
	if op != "create_topics" {
		return nil, bridge.Badf("unknown op %s for an admin client", op)
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(r.Seconds("timeout"), time.Second))
	defer cancel()
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = int32(r.Seconds("timeout").Milliseconds())
	for _, item := range r.Partitions("topics") { // [name, partitions]: the same shape as a topic-partition
		t := kmsg.NewCreateTopicsRequestTopic()
		t.Topic, t.NumPartitions, t.ReplicationFactor = item.Topic, item.Partition, -1 // the cluster's default replication
		req.Topics = append(req.Topics, t)
	}
	resp, err := req.RequestWith(ctx, a.cl)
	if err != nil {
		return nil, err
	}
	for _, t := range resp.Topics {
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return nil, err
		}
	}
	return nil, nil
}

// --- errors ----------------------------------------------------------------------------

var fatal = map[int16]bool{
	kerr.ProducerFenced.Code: true, kerr.InvalidProducerEpoch.Code: true, kerr.OutOfOrderSequenceNumber.Code: true,
	kerr.UnsupportedVersion.Code: true, kerr.TopicAuthorizationFailed.Code: true, kerr.GroupAuthorizationFailed.Code: true,
	kerr.ClusterAuthorizationFailed.Code: true, kerr.TransactionalIDAuthorizationFailed.Code: true,
	kerr.SaslAuthenticationFailed.Code: true, kerr.FencedInstanceID.Code: true,
}

// clientErrors names franz-go's own errors, and says whether the record of a failed send never left the client.
var clientErrors = []struct {
	err       error
	name      string
	retriable bool
	unsent    bool
}{
	{kgo.ErrRecordTimeout, "ErrRecordTimeout", true, false},
	{kgo.ErrRecordRetries, "ErrRecordRetries", true, false},
	{kgo.ErrMaxBuffered, "ErrMaxBuffered", true, true},
	{kgo.ErrAborting, "ErrAborting", false, false},
	{kgo.ErrClientClosed, "ErrClientClosed", false, false},
	{context.DeadlineExceeded, "DeadlineExceeded", true, false},
	{context.Canceled, "Canceled", false, false},
}

// classify is the workload's reading of a franz-go error (docs/workload.md, "Errors").
func classify(err error, enqueued bool) bridge.Failure {
	f := bridge.Failure{Enqueued: enqueued, Message: err.Error()}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		f.Name, f.Retriable, f.Fatal = ke.Message, ke.Retriable, fatal[ke.Code]
	} else {
		f.Name = "KgoError"
		for _, known := range clientErrors {
			if errors.Is(err, known.err) {
				f.Name, f.Retriable = known.name, known.retriable
				if known.unsent {
					f.Enqueued = false
				}
				break
			}
		}
		if strings.Contains(err.Error(), "not in a transaction") {
			f.Name, f.Enqueued = "NotInTransaction", false
		}
	}
	// The Java client's rule, which the other clients follow: an error that is neither fatal nor
	// retriable leaves a transaction needing an abort.
	f.Abort = !f.Fatal && !f.Retriable
	return f
}

func (franz) Failure(err error, enqueued bool) bridge.Failure { return classify(err, enqueued) }
