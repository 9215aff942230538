package main

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// serverWatchers returns the watchers and watch streams the embedded etcd
// holds, from its own gauges, or -1 when it has none registered.
func serverWatchers() (watchers, streams float64) {
	watchers, streams = -1, -1
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return watchers, streams
	}
	for _, mf := range mfs {
		if len(mf.GetMetric()) == 0 {
			continue
		}
		switch mf.GetName() {
		case "etcd_debugging_mvcc_watcher_total":
			watchers = mf.GetMetric()[0].GetGauge().GetValue()
		case "etcd_debugging_mvcc_watch_stream_total":
			streams = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return watchers, streams
}

// settle waits, outside the measure, until the embedded etcd has let go of
// the watchers and watch streams a contender left (no more than before it
// ran): etcd tears them down after the client has gone, and left running,
// that work would land on the next contender's clock. It gives up, saying
// so, after 30 s.
func settle(watchers, streams float64) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		w, s := serverWatchers()
		if w <= watchers && s <= streams {
			return
		}
		if time.Now().After(deadline) {
			fmt.Printf("# etcd still holds %v watchers and %v streams (before the run: %v and %v)\n", w, s, watchers, streams)
			return
		}
		time.Sleep(10 * time.Millisecond) // polling etcd's gauges, outside the measure
	}
}
