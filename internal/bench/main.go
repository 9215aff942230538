// Command bench measures etcdwatch beside the official client (clientv3)
// and a minimal hand-written client on the raw gRPC API (raw), in one
// process run, alternating contenders over several repetitions. It prints
//
//	BENCH <workload> <contender> <metric>=<median> (min <min> max <max>) ...
//	RATIO <workload> <metric> etcdwatch/clientv3=<x> etcdwatch/raw=<y>
//
// Run it with `make bench`; flags set the sizes.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

var (
	reps           = flag.Int("reps", 3, "repetitions of each workload per contender")
	workloadsFlag  = flag.String("workloads", "create,resume,fanout,clientonly,memory,cuts,neighbour,quorum,viewsync,viewrelist,viewapply,fresh,starve,spread", "workloads to run, comma-separated")
	createN        = flag.Int("create", 10000, "create: watches to open")
	resumeN        = flag.Int("resume", 5000, "resume: live watches cut and resumed")
	fanoutN        = flag.Int("fanout", 1000, "fanout: watches on one key")
	fanoutPuts     = flag.Int("fanout-puts", 300, "fanout: puts to that key")
	events100      = flag.Int("events100", 2000000, "clientonly: events sent 100 to a response")
	events1        = flag.Int("events1", 200000, "clientonly: events sent 1 to a response")
	memoryN        = flag.Int("memory", 10000, "memory: idle watches")
	memoryChildOf  = flag.String("memory-child", "", "internal: measure memory for this contender and exit")
	callers        = flag.Int("callers", 0, "etcdwatch opens its watches with one WatchAll (0), or with this many goroutines calling Watch; raw-percall sends its creates from as many")
	verbose        = flag.Bool("v", false, "print each etcdwatch run's stream counters")
	contendersFlag = flag.String("contenders", "raw,clientv3,clientv3watch,etcdwatch,etcdwatch-handler", "contenders to run, comma-separated")
	cpuProfile     = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memProfile     = flag.String("memprofile", "", "write an allocation profile of the whole run to this file")
)

// result is one run's metrics.
type result map[string]float64

// workload runs once for a contender; rep numbers the repetition.
type workload struct {
	name string
	run  func(c contender, rep int) (result, error)
	// metrics are printed in this order, each with its median, min and max.
	metrics []string
	// more multiplies -reps for a workload whose figures swing more.
	more int
	// reps, when set, replaces -reps for a workload too slow for it.
	reps *int
	// together, when set instead of run, runs every contender at once.
	together func(cs []contender, rep int) (map[string]result, error)
	// names, when set, are the workload's own contenders (with together),
	// in place of -contenders; ratios then prints its RATIO lines.
	names  []string
	ratios func(medians map[string]map[string]float64)
}

var etcdEndpoint string

// resumeMore multiplies -reps for resume: a single resume moves by up to
// etcd's 100ms sync period, and ten times the samples make the median
// steady from one run to the next.
const resumeMore = 10

// cutsMore multiplies -reps for cuts, for the same reason: a series of ten
// cuts samples etcd's sync period ten times, and each series' median is
// one figure.
const cutsMore = 2

func main() {
	flag.Parse()
	if *memoryChildOf != "" {
		memoryChild(contenderNamed(*memoryChildOf))
		return
	}
	if *neighbourChildOf != "" {
		neighbourChild(contenderNamed(*neighbourChildOf))
		return
	}
	if *viewChildOf != "" {
		viewChild(*viewChildOf)
		return
	}
	dir, err := os.MkdirTemp("", "etcdwatch-bench-")
	check(err)
	defer os.RemoveAll(dir)
	srv, err := etcdwatchtest.StartEtcdIn(dir)
	check(err)
	defer srv.Stop()
	etcdEndpoint = srv.Endpoint
	fmt.Printf("# %s, %d CPUs, GOMAXPROCS %d, %d repetitions (resume %dx, cuts %dx, quorum %d), contenders alternating\n", runtime.Version(), runtime.NumCPU(), runtime.GOMAXPROCS(0), *reps, resumeMore, cutsMore, *quorumReps)

	all := []workload{
		{name: "create", run: runCreate, metrics: []string{"seconds", "watches_per_s"}},
		// Resumed watches catch up through etcd's unsynced-watcher loop,
		// which runs every 100ms: where a run falls in its period moves the
		// figure by up to 100ms, for every contender; see resumeMore.
		// cpu_seconds, the whole process's CPU time over the same window,
		// does not depend on that period.
		{name: "resume", run: runResume, metrics: []string{"seconds", "cpu_seconds"}, more: resumeMore},
		{name: "fanout", run: runFanout, metrics: []string{"events_per_s", "p50_ms", "p99_ms"}},
		{name: "clientonly", run: runClientOnly, metrics: []string{"events_per_s_100", "events_per_s_1", "allocs_per_event_100", "allocs_per_event_1"}},
		{name: "memory", run: runMemory, metrics: []string{"bytes_per_watch", "goroutines_per_watch"}},
		// Per repetition: the median and the highest resume over the cuts,
		// every contender cut at once (see runCuts). Each resume includes
		// up to etcd's 100ms sync period, as resume does: twice the
		// repetitions.
		{name: "cuts", together: runCuts, metrics: []string{"p50_ms", "max_ms"}, more: cutsMore},
		{name: "neighbour", run: runNeighbour, metrics: []string{"p50_ms", "p99_ms", "max_ms", "heap_before_mib", "heap_peak_mib", "heap_after_mib", "heap_after_over_before"}},
		{name: "quorum", run: runQuorum, metrics: []string{"ms"}, reps: quorumReps},
		// The view workloads have contenders of their own; see views.go.
		{name: "viewsync", together: runViewSync, names: viewSyncNames, ratios: viewSyncRatios, reps: viewRepsAtLeast3(),
			metrics: []string{"seconds", "heap_per_key", "overhead_per_key"}},
		{name: "viewrelist", together: runViewRelist, names: viewRelistNames, ratios: viewRelistRatios, reps: viewRepsAtLeast3(),
			metrics: []string{"seconds", "changes", "sync_seconds"}},
		{name: "viewapply", together: runViewApply, names: viewApplyNames, ratios: viewApplyRatios, reps: viewRepsAtLeast3(),
			metrics: []string{"events_per_s", "cpu_us_per_event", "lag_ms", "writer_events_per_s"}},
		// Freshness of a view of a range nobody writes; see fresh.go.
		{name: "fresh", together: runFresh, names: freshNames, ratios: freshRatios,
			metrics: []string{"wait_p50_ms", "wait_p99_ms", "wait_max_ms", "sync_p50_ms", "sync_p99_ms", "sync_max_ms"}},
		{name: "starve", together: runStarve, names: starveNames, ratios: starveRatios,
			metrics: []string{"sync_p50_ms", "sync_p99_ms", "sync_max_ms", "syncs", "during_catch_up"}},
		// Restarts of views from saved states against listings; see warm.go.
		{name: "warm", together: runWarm, names: warmNames, ratios: warmRatios, reps: viewRepsAtLeast3(),
			metrics: []string{"seconds", "mb_per_view", "etcd_cpu_seconds"}},
		// One Stream against a group of Streams on a 3-member cluster of
		// its own; see spread.go.
		{name: "spread", together: runSpread, names: spreadNames, ratios: spreadRatios,
			metrics: []string{"events_per_s", "p50_ms", "p99_ms", "resume_ms", "moved_share", "before_p99_ms", "during_p50_ms", "during_p99_ms", "others_p99_ms"}},
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		check(err)
		check(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		defer writeHeapProfile(*memProfile)
	}
	want := strings.Split(*workloadsFlag, ",")
	for _, w := range all {
		if slices.Contains(want, w.name) {
			runWorkload(w)
		}
	}
}

func runWorkload(w workload) {
	var contenders []contender
	for _, c := range allContenders() {
		if slices.Contains(strings.Split(*contendersFlag, ","), c.name()) {
			contenders = append(contenders, c)
		}
	}
	results := map[string][]result{}
	n := *reps
	if w.reps != nil {
		n = *w.reps
	}
	for rep := range n * max(w.more, 1) {
		if w.together != nil {
			rs, err := w.together(contenders, rep)
			if err != nil {
				fmt.Printf("# %s rep %d failed: %v\n", w.name, rep, err)
				continue
			}
			for name, r := range rs {
				results[name] = append(results[name], r)
			}
			runtime.GC()
			continue
		}
		for k := range contenders { // rotate the order each repetition
			c := contenders[(k+rep)%len(contenders)]
			watchers, streams := serverWatchers()
			r, err := w.run(c, rep)
			settle(watchers, streams)
			if err != nil {
				fmt.Printf("# %s %s rep %d failed: %v\n", w.name, c.name(), rep, err)
				continue
			}
			results[c.name()] = append(results[c.name()], r)
			runtime.GC()
		}
	}
	names := w.names
	if names == nil {
		for _, c := range contenders {
			names = append(names, c.name())
		}
	}
	medians := map[string]map[string]float64{}
	for _, name := range names {
		rs := results[name]
		if len(rs) == 0 {
			continue
		}
		medians[name] = map[string]float64{}
		line := fmt.Sprintf("BENCH %s %s", w.name, name)
		for _, m := range w.metrics {
			var vs []float64
			for _, r := range rs {
				vs = append(vs, r[m])
			}
			slices.Sort(vs)
			med := vs[len(vs)/2]
			medians[name][m] = med
			line += fmt.Sprintf(" %s=%s (min %s max %s)", m, num(med), num(vs[0]), num(vs[len(vs)-1]))
		}
		fmt.Println(line)
	}
	// ratio is a's median of m over b's, when both ran.
	ratio := func(a, b, m string) string {
		x, okA := medians[a][m]
		y, okB := medians[b][m]
		if !okA || !okB || y == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f", x/y)
	}
	if w.ratios != nil {
		w.ratios(medians)
		return
	}
	for _, m := range w.metrics {
		fmt.Printf("RATIO %s %s etcdwatch/clientv3=%s etcdwatch/raw=%s etcdwatch-handler/raw=%s clientv3watch/clientv3=%s\n", w.name, m,
			ratio("etcdwatch", "clientv3", m), ratio("etcdwatch", "raw", m), ratio("etcdwatch-handler", "raw", m), ratio("clientv3watch", "clientv3", m))
		if _, ok := medians["raw-percall"]; ok {
			fmt.Printf("RATIO %s %s etcdwatch/raw-percall=%s raw-percall/raw=%s\n", w.name, m, ratio("etcdwatch", "raw-percall", m), ratio("raw-percall", "raw", m))
		}
	}
}

// allContenders returns every contender, with its default settings.
func allContenders() []contender {
	return []contender{rawClient{}, rawClient{perCall: true}, clientv3Client{}, clientv3watchClient{}, etcdwatchClient{}, etcdwatchClient{handler: true}}
}

// contenderNamed returns the contender called name, or exits.
func contenderNamed(name string) contender {
	for _, c := range allContenders() {
		if c.name() == name {
			return c
		}
	}
	check(fmt.Errorf("no contender %q", name))
	return nil
}

func num(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return fmt.Sprintf("%.3g", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

func writeHeapProfile(path string) {
	f, err := os.Create(path)
	check(err)
	defer f.Close()
	check(pprof.Lookup("allocs").WriteTo(f, 0))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// plainConn returns a plain gRPC connection to addr.
func plainConn(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// withEndpoint gives clientv3 a client of its own on addr, as an
// application would have; the other contenders use conn.
func withEndpoint(c contender, addr string) contender {
	if _, ok := c.(clientv3Client); ok {
		return clientv3Client{endpoints: []string{addr}}
	}
	return c
}

func timeout() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Minute)
}
