package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/mirror"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
	"github.com/etcdwatch/etcdwatch/view"
)

var (
	viewKeys      = flag.Int("view-keys", 100000, "viewsync, viewrelist: keys under the listed prefix")
	viewValue     = flag.Int("view-value", 1024, "viewsync, viewrelist: bytes per value")
	viewChanges   = flag.Int("view-changes", 1000, "viewrelist: keys changed while the stream is down (a third each updated, deleted and created)")
	applyTxns     = flag.Int("apply-txns", 3000, "viewapply: transactions written per repetition")
	applyPerTxn   = flag.Int("apply-per-txn", 100, "viewapply: puts per transaction, each to an existing key")
	applyKeys     = flag.Int("apply-keys", 1000, "viewapply: keys under the written prefix")
	applyValue    = flag.Int("apply-value", 256, "viewapply: bytes per value")
	applyWriters  = flag.Int("apply-writers", 4, "viewapply: goroutines writing transactions")
	viewChildOf   = flag.String("view-child", "", "internal: run this view workload's contender, print its result and exit")
	viewChildRep  = flag.Int("view-rep", 0, "internal: the repetition of a view child")
	viewChildWant = flag.Int("view-events", 0, "internal: the events a viewapply child waits for")
	viewProfile   = flag.String("view-cpuprofile", "", "viewsync, viewrelist, viewapply, warm: write a CPU profile of each child's measured part to this path, suffixed .<contender>.<repetition>")
	viewHeap      = flag.String("view-memprofile", "", "viewsync: write a heap profile of what each child keeps (after its listing and two GCs) to this path, suffixed .<contender>.<repetition>")
)

// viewPrefix holds the -view-keys keys of viewsync and viewrelist, loaded
// once by whichever runs first.
const viewPrefix = "bench/view/"

// viewPage is the list contender's page, as clientv3's mirror and the
// view's own pages (before etcd 3.7) have it.
const viewPage = 1000

// Contenders of the view workloads, which are not watch clients.
var (
	viewSyncNames   = []string{"list", "mirror", "view", "view-paged"}
	viewRelistNames = []string{"view"}
	viewApplyNames  = []string{"stream", "view"}
	viewSyncSeconds float64 // viewsync's median for view, once it has run
	viewLoadOnce    sync.Once
	viewLoadErr     error
)

// viewRepsAtLeast3 is -reps, at least 3: medians of the view workloads.
func viewRepsAtLeast3() *int {
	n := max(*reps, 3)
	return &n
}

// loadViewKeys puts -view-keys keys of -view-value bytes under viewPrefix,
// 100 to a transaction from 8 goroutines, once per run.
func loadViewKeys() error {
	viewLoadOnce.Do(func() {
		start := time.Now()
		viewLoadErr = putKeys(viewPrefix, *viewKeys, *viewValue)
		if viewLoadErr == nil {
			fmt.Printf("# view keys: %d of %d bytes loaded in %.1fs\n", *viewKeys, *viewValue, time.Since(start).Seconds())
		}
	})
	if viewLoadErr != nil {
		return fmt.Errorf("loading the view keys: %w", viewLoadErr)
	}
	return nil
}

// viewKey is the i-th key of a prefix.
func viewKey(prefix string, i int) string { return fmt.Sprintf("%s%06d", prefix, i) }

// viewBytes is a value of n bytes that names i, so that values differ.
func viewBytes(n, i int) string {
	b := make([]byte, n)
	for k := range b {
		b[k] = 'a' + byte((i+k)%26)
	}
	copy(b, strconv.Itoa(i))
	return string(b)
}

// putKeys creates n keys of value bytes under prefix.
func putKeys(prefix string, n, value int) error {
	kv, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdEndpoint}})
	if err != nil {
		return err
	}
	defer kv.Close()
	ctx, cancel := timeout()
	defer cancel()
	const perTxn = 100
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for g := range errs {
		wg.Go(func() {
			for t := int(next.Add(1) - 1); t*perTxn < n; t = int(next.Add(1) - 1) {
				var ops []clientv3.Op
				for i := t * perTxn; i < min(n, (t+1)*perTxn); i++ {
					ops = append(ops, clientv3.OpPut(viewKey(prefix, i), viewBytes(value, i)))
				}
				if _, err := kv.Txn(ctx).Then(ops...).Commit(); err != nil {
					errs[g] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// runViewSync lists the view keys with each contender in turn, each in a
// child process of its own (so that the heap it measures is the
// contender's, not etcd's), in an order that rotates every repetition.
func runViewSync(_ []contender, rep int) (map[string]result, error) {
	if err := loadViewKeys(); err != nil {
		return nil, err
	}
	rs := map[string]result{}
	for k := range viewSyncNames {
		name := viewSyncNames[(k+rep)%len(viewSyncNames)]
		r, err := runChild(viewChildArgs("sync-"+name, viewPrefix, rep)...)
		if err != nil {
			return nil, err
		}
		rs[name] = r
	}
	return rs, nil
}

// viewSyncChild lists the view keys once with one contender and prints the
// time it took and the heap it holds after, per key. Before the clock
// starts, each contender has its client connected: the list and mirror a
// clientv3.Client that has made one Get, the view an etcdwatch Stream whose
// gRPC stream is open (a watch confirmed and canceled).
func viewSyncChild(name string) {
	ctx, cancel := timeout()
	defer cancel()
	var run func() (kept any, keys int, data int64, err error)
	switch name {
	case "list", "mirror":
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{*childEndpoint}})
		check(err)
		defer cli.Close()
		_, err = cli.Get(ctx, *childPrefix+"warm")
		check(err)
		run = func() (any, int, int64, error) { return listKeys(ctx, cli, *childPrefix) }
		if name == "mirror" {
			run = func() (any, int, int64, error) { return mirrorKeys(ctx, cli, *childPrefix) }
		}
	case "view", "view-paged":
		var opts []grpc.DialOption
		if name == "view-paged" {
			opts = append(opts, grpc.WithStreamInterceptor(noRangeStream))
		}
		conn, err := viewDial(*childEndpoint, opts...)
		check(err)
		defer conn.Close()
		s, err := etcdwatch.Open(conn)
		check(err)
		defer s.Close()
		w, err := s.Watch(ctx, etcdwatch.Key(*childPrefix+"warm"))
		check(err)
		w.Cancel()
		run = func() (any, int, int64, error) {
			v, err := view.New(ctx, s, etcdwatch.Prefix(*childPrefix), view.DecodeBytes)
			if err != nil {
				return nil, 0, 0, err
			}
			st := v.Stats()
			return v, st.Keys, st.Bytes, nil
		}
	default:
		check(fmt.Errorf("no viewsync contender %q", name))
	}
	if *viewHeap != "" {
		runtime.MemProfileRate = 512 // every object of a small state sampled, near enough
	}
	before := heapAfterGC()
	stop := profileChild(name)
	start := time.Now()
	kept, keys, data, err := run()
	took := time.Since(start)
	stop()
	check(err)
	after := heapAfterGC()
	heapProfile(name)
	runtime.KeepAlive(kept)
	if keys == 0 {
		check(fmt.Errorf("%s listed no keys", name))
	}
	perKey := float64(int64(after)-int64(before)) / float64(keys)
	printResult(result{
		"seconds": took.Seconds(), "keys": float64(keys),
		"heap_per_key": perKey, "overhead_per_key": perKey - float64(data)/float64(keys),
	})
}

// listKeys is the list contender: what an application writes by hand
// with clientv3, pages of viewPage keys, each page after the first pinned
// to the first's revision, into a map sized by the first page's count.
func listKeys(ctx context.Context, cli *clientv3.Client, prefix string) (map[string][]byte, int, int64, error) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	var (
		m    map[string][]byte
		rev  int64
		data int64
	)
	key := prefix
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(viewPage)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := cli.Get(ctx, key, opts...)
		if err != nil {
			return nil, 0, 0, err
		}
		if rev == 0 {
			rev, m = resp.Header.Revision, make(map[string][]byte, resp.Count)
		}
		for _, kv := range resp.Kvs {
			m[string(kv.Key)] = kv.Value
			data += int64(len(kv.Key) + len(kv.Value))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return m, len(m), data, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// mirrorKeys is the mirror contender: clientv3's mirror.Syncer SyncBase,
// every response consumed and its KeyValues kept.
func mirrorKeys(ctx context.Context, cli *clientv3.Client, prefix string) ([]*mvccpb.KeyValue, int, int64, error) {
	resps, errc := mirror.NewSyncer(cli, prefix, 0).SyncBase(ctx)
	var (
		kvs  []*mvccpb.KeyValue
		data int64
	)
	for r := range resps {
		kvs = append(kvs, r.Kvs...)
		for _, kv := range r.Kvs {
			data += int64(len(kv.Key) + len(kv.Value))
		}
	}
	if err := <-errc; err != nil {
		return nil, 0, 0, err
	}
	return kvs, len(kvs), data, nil
}

// viewSyncRatios prints the view's time against the list's and the
// mirror's, and each contender's heap per key beyond its keys and values,
// and keeps the view's time for viewrelist.
func viewSyncRatios(med map[string]map[string]float64) {
	viewSyncSeconds = med["view"]["seconds"]
	fmt.Printf("RATIO viewsync seconds view/list=%s view/mirror=%s (target view/list <= 1.0)\n",
		ratioOf(med, "view", "list", "seconds"), ratioOf(med, "view", "mirror", "seconds"))
	fmt.Printf("RATIO viewsync seconds view-paged/list=%s (the view listing in pages, as before etcd 3.7; target <= 1.0)\n",
		ratioOf(med, "view-paged", "list", "seconds"))
	fmt.Printf("RATIO viewsync overhead_per_key view=%s view-paged=%s list=%s mirror=%s (bytes beyond key+value; target view <= 64)\n",
		valueOf(med, "view", "overhead_per_key"), valueOf(med, "view-paged", "overhead_per_key"),
		valueOf(med, "list", "overhead_per_key"), valueOf(med, "mirror", "overhead_per_key"))
}

// ratioOf is a's median of m over b's, or n/a.
func ratioOf(med map[string]map[string]float64, a, b, m string) string {
	x, okA := med[a][m]
	y, okB := med[b][m]
	if !okA || !okB || y == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", x/y)
}

func valueOf(med map[string]map[string]float64, c, m string) string {
	x, ok := med[c][m]
	if !ok {
		return "n/a"
	}
	return fmt.Sprintf("%.3g", x)
}

// runViewRelist runs viewRelistChild once, in a process of its own.
func runViewRelist(_ []contender, rep int) (map[string]result, error) {
	if err := loadViewKeys(); err != nil {
		return nil, err
	}
	r, err := runChild(viewChildArgs("relist", viewPrefix, rep,
		"-view-keys", strconv.Itoa(*viewKeys), "-view-changes", strconv.Itoa(*viewChanges), "-view-value", strconv.Itoa(*viewValue))...)
	if err != nil {
		return nil, err
	}
	return map[string]result{"view": r}, nil
}

// viewRelistChild opens a view of the view keys through a fault proxy
// (timing view.New: sync_seconds) and subscribes to it. It refuses and cuts
// the proxy's connections, waits until the Stream says it is down, changes
// -view-changes distinct keys, a third each updated, deleted and created,
// and compacts the store past them, so that the watch cannot resume. The
// figure is the time from the proxy forwarding again until the subscriber
// has the Relisted batch: the reconnect, the compacted watch, the new
// listing and its comparison with the old state. The batch must hold
// exactly the changes made; anything else fails the run.
func viewRelistChild() {
	ctx, cancel := timeout()
	defer cancel()
	proxy, err := etcdwatchtest.ListenProxy(*childEndpoint)
	check(err)
	defer proxy.Close()
	conn, err := viewDial(proxy.Addr())
	check(err)
	defer conn.Close()
	s, err := etcdwatch.Open(conn)
	check(err)
	defer s.Close()
	kv, err := clientv3.New(clientv3.Config{Endpoints: []string{*childEndpoint}})
	check(err)
	defer kv.Close()
	w, err := s.Watch(ctx, etcdwatch.Key(*childPrefix+"warm"))
	check(err)
	w.Cancel()

	start := time.Now()
	v, err := view.New(ctx, s, etcdwatch.Prefix(*childPrefix), view.DecodeBytes)
	check(err)
	syncTook := time.Since(start)
	defer v.Close()
	sub := v.Subscribe(context.Background(), v.Revision())
	defer sub.Close()
	keysBefore := v.Len()

	proxy.Refuse(true)
	proxy.Cut()
	check(waitFor(ctx, func() bool { return !s.State().Connected }))
	want, err := changeViewKeys(ctx, kv, v)
	check(err)

	stop := profileChild("relist")
	restore := time.Now()
	proxy.Refuse(false)
	var b view.Batch[[]byte]
	for {
		b, err = sub.Next(ctx)
		check(err)
		if b.Kind != view.Events || len(b.Changes) > 0 {
			break
		}
		// a bookmark that moved the revision: nothing changed yet
	}
	took := time.Since(restore)
	stop()
	if b.Kind != view.Relisted {
		check(fmt.Errorf("relist: the first batch after the restore is %v with %d changes, not relisted", b.Kind, len(b.Changes)))
	}
	got := map[string]view.ChangeKind{}
	for _, ch := range b.Changes {
		if _, dup := got[ch.Key]; dup {
			check(fmt.Errorf("relist: key %q twice in the batch", ch.Key))
		}
		got[ch.Key] = ch.Kind
	}
	if len(b.Changes) != len(want) || len(got) != len(want) {
		check(fmt.Errorf("relist: %d changes in the batch (%d keys), want exactly %d", len(b.Changes), len(got), len(want)))
	}
	for k, kind := range want {
		if got[k] != kind {
			check(fmt.Errorf("relist: key %q is %v in the batch, want %v", k, got[k], kind))
		}
	}
	if st := v.Stats(); st.Relists != 1 || st.Keys != keysBefore {
		check(fmt.Errorf("relist: %d relists and %d keys after, want 1 and %d", st.Relists, st.Keys, keysBefore))
	}
	printResult(result{"seconds": took.Seconds(), "changes": float64(len(b.Changes)), "sync_seconds": syncTook.Seconds()})
}

// changeViewKeys changes -view-changes keys of the view's range, a third
// each updated, deleted and created, chosen by -view-rep so that every
// repetition changes keys of its own, 100 to a transaction; then compacts
// the store at the last one's revision. It returns each key's change.
func changeViewKeys(ctx context.Context, kv *clientv3.Client, v *view.View[[]byte]) (map[string]view.ChangeKind, error) {
	n := *viewChanges
	want := make(map[string]view.ChangeKind, n)
	var ops []clientv3.Op
	var rev int64
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		resp, err := kv.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return err
		}
		rev, ops = resp.Header.Revision, ops[:0]
		return nil
	}
	// Existing keys, taken in key order from a start that moves with the
	// repetition, so that keys deleted by an earlier one are not chosen.
	var existing []string
	skip := (*viewChildRep * n) % max(v.Len()-n, 1)
	for k := range v.All() {
		if skip > 0 {
			skip--
			continue
		}
		if existing = append(existing, k); len(existing) == n-n/3 {
			break
		}
	}
	if len(existing) < n-n/3 {
		return nil, fmt.Errorf("relist: %d keys to change, %d in the view", n, v.Len())
	}
	for i := range n {
		var key string
		switch {
		case i < n/3: // created: a key of this repetition's own
			key = fmt.Sprintf("%snew-%03d-%06d", *childPrefix, *viewChildRep, i)
			ops = append(ops, clientv3.OpPut(key, viewBytes(*viewValue, i)))
			want[key] = view.Created
		case i < 2*n/3:
			key = existing[i-n/3]
			ops = append(ops, clientv3.OpDelete(key))
			want[key] = view.Deleted
		default:
			key = existing[i-n/3]
			ops = append(ops, clientv3.OpPut(key, viewBytes(*viewValue, -i)))
			want[key] = view.Updated
		}
		if len(ops) == 100 {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if _, err := kv.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return nil, err
	}
	return want, nil
}

// viewDial is an application's connection: dial.New, plain text.
func viewDial(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return dial.New([]string{addr}, dial.WithInsecure(), dial.WithGRPCOptions(opts...))
}

// noRangeStream refuses the RangeStream RPC as a server before etcd 3.7
// does, so that the view-paged contender lists in pages, as list does.
func noRangeStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if method == pb.KV_RangeStream_FullMethodName {
		return nil, status.Error(codes.Unimplemented, "bench: RangeStream refused, as before etcd 3.7")
	}
	return streamer(ctx, desc, cc, method, opts...)
}

// waitFor polls cond every millisecond until it holds or ctx ends: for
// states that have no event to wait for.
func waitFor(ctx context.Context, cond func() bool) error {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// viewRelistRatios prints the relist's time against viewsync's view (when
// viewsync ran) and against the same child's own first listing, made
// through the proxy.
func viewRelistRatios(med map[string]map[string]float64) {
	vs := "n/a"
	if viewSyncSeconds > 0 {
		vs = fmt.Sprintf("%.2f", med["view"]["seconds"]/viewSyncSeconds)
	}
	own := "n/a"
	if y := med["view"]["sync_seconds"]; y > 0 {
		own = fmt.Sprintf("%.2f", med["view"]["seconds"]/y)
	}
	fmt.Printf("RATIO viewrelist seconds relist/viewsync_view=%s relist/own_sync=%s (target relist/viewsync_view <= 1.2)\n", vs, own)
}

// runViewApply measures how fast a View takes events beside a plain
// Stream watch, from one live writer: both contenders watch the written
// prefix at once, each in a child process of its own with a connection of
// its own, so that they get the very same revisions and that each child's
// CPU time is its contender's alone. Once both say they are ready, this
// process writes -apply-txns transactions of -apply-per-txn puts to
// existing keys, from -apply-writers goroutines, as fast as etcd takes
// them. A contender's rate is the events it got over the time from the
// first write to its last delivery; its CPU is the child's, user and
// system, from ready to its last delivery.
func runViewApply(_ []contender, rep int) (map[string]result, error) {
	prefix := fmt.Sprintf("bench/apply/%d/", rep)
	if err := putKeys(prefix, *applyKeys, *applyValue); err != nil {
		return nil, err
	}
	if *applyPerTxn > *applyKeys {
		return nil, fmt.Errorf("viewapply: %d puts a transaction to %d keys", *applyPerTxn, *applyKeys)
	}
	events := *applyTxns * *applyPerTxn
	children := make([]*applyChild, len(viewApplyNames))
	defer func() {
		for _, c := range children {
			c.kill()
		}
	}()
	for k := range viewApplyNames { // start order rotates
		name := viewApplyNames[(k+rep)%len(viewApplyNames)]
		c, err := startApplyChild(name, prefix, rep, events)
		if err != nil {
			return nil, err
		}
		children[k] = c
	}
	start := time.Now()
	if err := writeApply(prefix); err != nil {
		return nil, err
	}
	wrote := time.Since(start)
	rs := map[string]result{}
	for _, c := range children {
		r, err := c.result()
		if err != nil {
			return nil, err
		}
		if int(r["events"]) != events {
			return nil, fmt.Errorf("viewapply %s: %v events, want %d", c.name, r["events"], events)
		}
		took := time.Duration(int64(r["last_unix_ns"]) - start.UnixNano())
		if *verbose || took-wrote > time.Second { // a contender that fell behind says what its Stream did
			fmt.Printf("# viewapply %s rep %d: %.0f responses, %.0f stalls, %.0f pauses, %.0f reconnects, last event %v after the first write, %v after the last\n",
				c.name, rep, r["responses"], r["stalls"], r["pauses"], r["reconnects"], took.Round(time.Millisecond), (took - wrote).Round(time.Millisecond))
		}
		rs[c.name] = result{
			"events_per_s":        float64(events) / took.Seconds(),
			"cpu_us_per_event":    r["cpu_seconds"] * 1e6 / float64(events),
			"lag_ms":              ms(max(took-wrote, 0)),
			"writer_events_per_s": float64(events) / wrote.Seconds(),
		}
	}
	return rs, nil
}

// writeApply writes -apply-txns transactions of -apply-per-txn puts under
// prefix, each to keys that exist, from -apply-writers goroutines.
func writeApply(prefix string) error {
	kv, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdEndpoint}})
	if err != nil {
		return err
	}
	defer kv.Close()
	ctx, cancel := timeout()
	defer cancel()
	value := viewBytes(*applyValue, 0)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, *applyWriters)
	for g := range errs {
		wg.Go(func() {
			ops := make([]clientv3.Op, *applyPerTxn)
			for t := int(next.Add(1) - 1); t < *applyTxns; t = int(next.Add(1) - 1) {
				for j := range ops {
					ops[j] = clientv3.OpPut(viewKey(prefix, (t**applyPerTxn+j)%*applyKeys), value)
				}
				if _, err := kv.Txn(ctx).Then(ops...).Commit(); err != nil {
					errs[g] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// applyChild is a viewapply contender running in a child process.
type applyChild struct {
	name   string
	cmd    *exec.Cmd
	out    *bufio.Reader
	stderr strings.Builder
}

// startApplyChild starts the child and returns once it is ready: watching.
func startApplyChild(name, prefix string, rep, events int) (*applyChild, error) {
	c := &applyChild{name: name}
	c.cmd = exec.Command(os.Args[0], viewChildArgs("apply-"+name, prefix, rep, "-view-events", strconv.Itoa(events))...)
	c.cmd.Stderr = &c.stderr
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	c.out = bufio.NewReader(out)
	line, err := c.out.ReadString('\n')
	if err != nil || line != "ready\n" {
		c.kill()
		return nil, fmt.Errorf("viewapply child %s said %q (%v): %s", name, line, err, lastLines([]byte(c.stderr.String()), 5))
	}
	return c, nil
}

// result waits for the child to end and parses what it printed.
func (c *applyChild) result() (result, error) {
	out, _ := io.ReadAll(c.out)
	if err := c.cmd.Wait(); err != nil {
		return nil, fmt.Errorf("viewapply child %s: %w: %s", c.name, err, lastLines([]byte(c.stderr.String()), 5))
	}
	c.cmd = nil
	r := result{}
	for _, f := range strings.Fields(string(out)) {
		k, v, ok := strings.Cut(f, "=")
		x, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("viewapply child %s said %q", c.name, out)
		}
		r[k] = x
	}
	return r, nil
}

// kill ends a child that has not been waited for.
func (c *applyChild) kill() {
	if c == nil || c.cmd == nil {
		return
	}
	c.cmd.Process.Kill()
	c.cmd.Wait()
	c.cmd = nil
}

// viewApplyChild watches the prefix with one contender, says "ready", and
// counts events until it has -view-events: "stream" a Watch on an
// etcdwatch Stream whose loop counts each Response's events, "view" a
// View whose one subscriber counts each batch's changes.
func viewApplyChild(name string) {
	ctx, cancel := timeout()
	defer cancel()
	conn, err := viewDial(*childEndpoint)
	check(err)
	defer conn.Close()
	s, err := etcdwatch.Open(conn)
	check(err)
	defer s.Close()
	want := *viewChildWant
	var consume func() (int, error)
	switch name {
	case "stream":
		w, err := s.Watch(ctx, etcdwatch.Prefix(*childPrefix))
		check(err)
		consume = func() (int, error) {
			n := 0
			for r := range w.Responses() {
				if n += len(r.Events); n >= want {
					return n, nil
				}
			}
			return n, w.Err()
		}
	case "view":
		v, err := view.New(ctx, s, etcdwatch.Prefix(*childPrefix), view.DecodeBytes)
		check(err)
		defer v.Close()
		sub := v.Subscribe(context.Background(), v.Revision())
		defer sub.Close()
		consume = func() (int, error) {
			n := 0
			for n < want {
				b, err := sub.Next(ctx)
				if err != nil {
					return n, err
				}
				if b.Kind != view.Events {
					return n, fmt.Errorf("a %v batch of %d changes after %d changes", b.Kind, len(b.Changes), n)
				}
				for _, ch := range b.Changes {
					if ch.Kind != view.Updated {
						return n, fmt.Errorf("key %q %v, want updated", ch.Key, ch.Kind)
					}
				}
				n += len(b.Changes)
			}
			return n, nil
		}
	default:
		check(fmt.Errorf("no viewapply contender %q", name))
	}
	stop := profileChild(name)
	cpu := cpuTime()
	fmt.Println("ready")
	n, err := consume()
	last := time.Now()
	cpu = cpuTime() - cpu
	stop()
	check(err)
	st := s.Stats()
	printResult(result{"events": float64(n), "last_unix_ns": float64(last.UnixNano()), "cpu_seconds": cpu.Seconds(),
		"responses": float64(st.Responses), "stalls": float64(st.Stalls), "pauses": float64(st.Pauses), "reconnects": float64(st.Reconnects)})
}

// viewApplyRatios prints the view's delivery rate against the stream's
// (both bound by the writer when they keep up), and its events per CPU
// second against the stream's: what each could take were it the limit.
func viewApplyRatios(med map[string]map[string]float64) {
	capacity := "n/a"
	if x := med["view"]["cpu_us_per_event"]; x > 0 && med["stream"]["cpu_us_per_event"] > 0 {
		capacity = fmt.Sprintf("%.2f", med["stream"]["cpu_us_per_event"]/x)
	}
	fmt.Printf("RATIO viewapply events_per_s view/stream=%s (target >= 0.8)\n", ratioOf(med, "view", "stream", "events_per_s"))
	fmt.Printf("RATIO viewapply events_per_cpu_s view/stream=%s\n", capacity)
}

// viewChildArgs are the arguments of a view child.
func viewChildArgs(mode, prefix string, rep int, more ...string) []string {
	args := []string{"-view-child", mode, "-endpoint", etcdEndpoint, "-prefix", prefix, "-view-rep", strconv.Itoa(rep)}
	if *viewProfile != "" {
		args = append(args, "-view-cpuprofile", *viewProfile)
	}
	if *viewHeap != "" {
		args = append(args, "-view-memprofile", *viewHeap)
	}
	return append(args, more...)
}

// profileChild starts a CPU profile of a child's measured part, when
// -view-cpuprofile asks for one, and returns what stops it.
func profileChild(contender string) func() {
	if *viewProfile == "" {
		return func() {}
	}
	f, err := os.Create(fmt.Sprintf("%s.%s.%d", *viewProfile, contender, *viewChildRep))
	check(err)
	check(pprof.StartCPUProfile(f))
	return func() {
		pprof.StopCPUProfile()
		check(f.Close())
	}
}

// heapProfile writes the heap profile of a viewsync child, when
// -view-memprofile asks for one: go tool pprof -sample_index inuse_space.
func heapProfile(contender string) {
	if *viewHeap == "" {
		return
	}
	f, err := os.Create(fmt.Sprintf("%s.%s.%d", *viewHeap, contender, *viewChildRep))
	check(err)
	check(pprof.WriteHeapProfile(f))
	check(f.Close())
}

// viewChild runs the child side of a view workload.
func viewChild(mode string) {
	switch {
	case strings.HasPrefix(mode, "sync-"):
		viewSyncChild(strings.TrimPrefix(mode, "sync-"))
	case mode == "relist":
		viewRelistChild()
	case strings.HasPrefix(mode, "apply-"):
		viewApplyChild(strings.TrimPrefix(mode, "apply-"))
	case strings.HasPrefix(mode, "warm-"):
		warmChild(strings.TrimPrefix(mode, "warm-"))
	default:
		check(fmt.Errorf("no view child %q", mode))
	}
}
