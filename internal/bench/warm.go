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
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/view"
)

var (
	warmViews   = flag.Int("warm-views", 4, "warm: views restarted at once, each in a process of its own")
	warmWrites  = flag.Int("warm-writes", 1000, "warm: keys updated since the save, for warm-writes and the compacted contenders")
	warmFault   = flag.Int("warm-prefault", 0, "warm: MiB each child touches and lets go before the clock starts, every contender alike, so that its heap grows into memory already mapped (first touches are slow on some VMs)")
	warmFile    = flag.String("warm-file", "", "internal: the state file of a warm child")
	warmWritten = flag.Int("warm-written", 0, "internal: the keys a warm child must find changed since the save")
)

// warmNames are the warm workload's contenders, run in this order each
// repetition, since each one's views save, at their Close, the state the
// next one restores: cold (no state files: the views list), warm (nothing
// changed since the save), warm-writes (-warm-writes keys updated since),
// warm-compacted (as many updated, and the store compacted past them), and
// cold-compacted: the same writes and compaction, then no state files, so
// that warm-compacted is compared with a listing that meets etcd in the
// same state (a listing right after a compaction costs etcd more).
var warmNames = []string{"cold", "warm", "warm-writes", "cold-compacted", "warm-compacted"}

// runWarm restarts -warm-views views of the view keys, each in a child
// process of its own with a state file of its own (view.WithStateFile),
// four ways in turn (warmNames). Each child connects, says so, and waits;
// once all have, this process tells them to start at once, and a
// contender's figures are the time until every view is ready (New has
// returned), the bytes of the gRPC messages the children received from
// etcd meanwhile, and this process's CPU time meanwhile, which is etcd's:
// it runs here, and the children are processes of their own.
func runWarm(_ []contender, rep int) (map[string]result, error) {
	if err := loadViewKeys(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "etcdwatch-warm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	rs := map[string]result{}
	for _, name := range warmNames {
		written := 0
		if name != "cold" && name != "warm" {
			written = *warmWrites
			if err := writeSinceSave(rep, name, strings.HasSuffix(name, "-compacted")); err != nil {
				return nil, err
			}
		}
		r, err := restartViews(name, dir, rep, written)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		rs[name] = r
	}
	return rs, nil
}

// writeSinceSave updates -warm-writes of the view keys, 100 to a
// transaction, others each repetition and contender, and compacts the
// store past them if asked. Keys are updated, never created or deleted,
// so that the other view workloads find the count they loaded.
func writeSinceSave(rep int, name string, compact bool) error {
	kv, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdEndpoint}})
	if err != nil {
		return err
	}
	defer kv.Close()
	ctx, cancel := timeout()
	defer cancel()
	n := *warmWrites
	base := (rep*len(warmNames) + slices.Index(warmNames, name)) * n
	var rev int64
	for i := 0; i < n; i += 100 {
		var ops []clientv3.Op
		for j := i; j < min(i+100, n); j++ {
			k := (base + j) % *viewKeys
			ops = append(ops, clientv3.OpPut(viewKey(viewPrefix, k), viewBytes(*viewValue, -k-rep-1)))
		}
		resp, err := kv.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return err
		}
		rev = resp.Header.Revision
	}
	if compact {
		_, err = kv.Compact(ctx, rev, clientv3.WithCompactPhysical())
	}
	return err
}

// warmChildProc is one view of a warm contender, in a child process.
type warmChildProc struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr strings.Builder
}

// restartViews starts the views of one contender, each in a child process,
// and returns the contender's figures once every view is ready.
func restartViews(name, dir string, rep, written int) (result, error) {
	if strings.HasPrefix(name, "cold") {
		for i := range *warmViews {
			if err := os.Remove(warmPath(dir, i)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, err
			}
		}
	}
	children := make([]*warmChildProc, *warmViews)
	defer func() {
		for _, c := range children {
			if c != nil && c.cmd.Process != nil {
				c.cmd.Process.Kill()
				c.cmd.Wait()
			}
		}
	}()
	for i := range children {
		c := &warmChildProc{}
		c.cmd = exec.Command(os.Args[0], viewChildArgs("warm-"+name, viewPrefix, rep,
			"-warm-file", warmPath(dir, i), "-warm-written", strconv.Itoa(written), "-warm-prefault", strconv.Itoa(*warmFault))...)
		c.cmd.Stderr = &c.stderr
		var err error
		if c.in, err = c.cmd.StdinPipe(); err != nil {
			return nil, err
		}
		out, err := c.cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := c.cmd.Start(); err != nil {
			return nil, err
		}
		children[i] = c
		c.out = bufio.NewReader(out)
		if line, err := c.out.ReadString('\n'); err != nil || line != "connected\n" {
			return nil, fmt.Errorf("child %d said %q (%v): %s", i, line, err, lastLines([]byte(c.stderr.String()), 5))
		}
	}
	runtime.GC() // not during the measure
	start, cpu := time.Now(), cpuTime()
	for _, c := range children {
		if _, err := io.WriteString(c.in, "go\n"); err != nil {
			return nil, err
		}
	}
	var last time.Time
	var bytes float64
	for i, c := range children {
		line, err := c.out.ReadString('\n')
		if err != nil {
			c.cmd.Wait()
			return nil, fmt.Errorf("child %d: %v: %s", i, err, lastLines([]byte(c.stderr.String()), 5))
		}
		r, err := parseResult(line)
		if err != nil {
			return nil, fmt.Errorf("child %d: %w", i, err)
		}
		if t := time.Unix(0, int64(r["ready_unix_ns"])); t.After(last) {
			last = t
		}
		bytes += r["bytes"]
	}
	etcdCPU := cpuTime() - cpu
	for i, c := range children { // each saves its state as its view closes, then exits
		c.in.Close()
		if err := c.cmd.Wait(); err != nil {
			return nil, fmt.Errorf("child %d: %w: %s", i, err, lastLines([]byte(c.stderr.String()), 5))
		}
		children[i] = nil
	}
	// The states just saved are written back before the next contender,
	// not during it: left to the kernel, the write-back of some 400 MB
	// took CPU from whichever contender came next (etcd's CPU for one
	// listing moved by 30% with its place in the order).
	syscall.Sync()
	n := float64(*warmViews)
	return result{
		"seconds":          last.Sub(start).Seconds(),
		"mb_per_view":      bytes / n / 1e6,
		"etcd_cpu_seconds": etcdCPU.Seconds(),
	}, nil
}

func warmPath(dir string, i int) string { return filepath.Join(dir, fmt.Sprintf("view-%d.state", i)) }

// parseResult parses a child's printResult line.
func parseResult(line string) (result, error) {
	r := result{}
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		x, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("said %q", line)
		}
		r[k] = x
	}
	return r, nil
}

// received counts the bytes of the gRPC messages a connection receives
// (their length on the wire with gRPC's 5-byte message header; not the
// HTTP/2 framing under it).
type received struct{ n atomic.Int64 }

func (r *received) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (r *received) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (r *received) HandleConn(context.Context, stats.ConnStats) {}

func (r *received) HandleRPC(_ context.Context, s stats.RPCStats) {
	if p, ok := s.(*stats.InPayload); ok {
		r.n.Add(int64(p.WireLength))
	}
}

// warmChild is one view of the warm workload: it connects (its Stream's
// gRPC stream open), says "connected", and on "go" makes its view with
// view.WithStateFile, prints when it was ready and the bytes received
// since "go", checks that it restored or listed as its contender should,
// and closes it (which saves its state) once stdin closes.
func warmChild(name string) {
	ctx, cancel := timeout()
	defer cancel()
	var got received
	conn, err := viewDial(*childEndpoint, grpc.WithStatsHandler(&got))
	check(err)
	defer conn.Close()
	s, err := etcdwatch.Open(conn)
	check(err)
	defer s.Close()
	w, err := s.Watch(ctx, etcdwatch.Key(*childPrefix+"warm"))
	check(err)
	w.Cancel()
	prefault(*warmFault)
	in := bufio.NewReader(os.Stdin)
	fmt.Println("connected")
	if line, err := in.ReadString('\n'); err != nil || line != "go\n" {
		check(fmt.Errorf("warm child: read %q (%v), not go", line, err))
	}
	// One profile per view: the -warm-views children of a repetition run at
	// once, and would otherwise write the same file.
	stop := profileChild(name + "-" + strings.TrimSuffix(filepath.Base(*warmFile), ".state"))
	before := got.n.Load()
	v, err := view.New(ctx, s, etcdwatch.Prefix(*childPrefix), view.DecodeBytes, view.WithStateFile(*warmFile, 0))
	ready := time.Now()
	bytes := got.n.Load() - before
	stop()
	check(err)
	check(checkWarmStart(ctx, name, v))
	printResult(result{"ready_unix_ns": float64(ready.UnixNano()), "bytes": float64(bytes)})
	io.Copy(io.Discard, in) // until the parent has every result
	check(v.Close())
}

// prefault touches mib MiB of new memory a page at a time and lets it go:
// the Go heap keeps what it mapped for a while, so that the view grows
// into memory the system has already backed. On this project's CI VM a
// first touch costs about 4.7 ms a MiB (3 GiB in 14 s), so that building
// a 100 MB state costs some 0.5 s whichever way it comes.
func prefault(mib int) {
	if mib <= 0 {
		return
	}
	held := make([][]byte, mib)
	for i := range held {
		held[i] = make([]byte, 1<<20)
		for k := 0; k < len(held[i]); k += 4096 {
			held[i][k] = 1
		}
	}
	runtime.KeepAlive(held)
	held = nil
	runtime.GC()
}

// checkWarmStart fails a view that did not start as its contender should:
// cold from a listing; the others from the saved state, their first batch
// holding exactly the -warm-written updates (Events, or Relisted after the
// compaction).
func checkWarmStart(ctx context.Context, name string, v *view.View[[]byte]) error {
	rev, err := v.Restored()
	switch {
	case err != nil:
		return fmt.Errorf("%s: %w", name, err)
	case strings.HasPrefix(name, "cold") && rev != 0:
		return fmt.Errorf("%s: restored revision %d", name, rev)
	case strings.HasPrefix(name, "cold"):
		return nil
	case rev == 0:
		return fmt.Errorf("%s: not restored", name)
	}
	relists := v.Stats().Relists
	if (name == "warm-compacted") != (relists == 1) {
		return fmt.Errorf("%s: %d relists", name, relists)
	}
	if *warmWritten == 0 { // nothing changed since the save: no batch to check
		return nil
	}
	sub := v.Subscribe(context.Background(), rev)
	defer sub.Close()
	b, err := sub.Next(ctx)
	if err != nil {
		return err
	}
	kind := view.Events
	if name == "warm-compacted" {
		kind = view.Relisted
	}
	if b.Kind != kind || len(b.Changes) != *warmWritten || b.Revision != v.Revision() {
		return fmt.Errorf("%s: first batch %v %d..%d of %d changes; want %v of %d to %d", name, b.Kind, b.From, b.Revision, len(b.Changes), kind, *warmWritten, v.Revision())
	}
	for _, ch := range b.Changes {
		if ch.Kind != view.Updated {
			return fmt.Errorf("%s: %q %v", name, ch.Key, ch.Kind)
		}
	}
	return nil
}

// warmRatios prints each warm contender's figures against its cold one's,
// with the targets.
func warmRatios(med map[string]map[string]float64) {
	for _, r := range []struct{ warm, cold, target string }{
		{"warm", "cold", "target: bytes <= 0.05, seconds <= 0.2"},
		{"warm-writes", "cold", "target: bytes <= 0.05, seconds <= 0.2"},
		{"warm-compacted", "cold-compacted", "target: no worse than cold"},
		{"warm-compacted", "cold", ""},
	} {
		ratio := func(m string) string { // three digits: the bytes' ratio is about 0.001
			x, okW := med[r.warm][m]
			y, okC := med[r.cold][m]
			if !okW || !okC || y == 0 {
				return "n/a"
			}
			return fmt.Sprintf("%.3g", x/y)
		}
		fmt.Printf("RATIO warm %s/%s mb_per_view=%s seconds=%s etcd_cpu_seconds=%s", r.warm, r.cold,
			ratio("mb_per_view"), ratio("seconds"), ratio("etcd_cpu_seconds"))
		if r.target != "" {
			fmt.Printf(" (%s)", r.target)
		}
		fmt.Println()
	}
}
