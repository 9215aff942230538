package etcdwatchprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/view"
)

// ViewSource is what a ViewCollector reads. *view.View[T] implements it,
// whatever T; a test may pass its own.
type ViewSource interface {
	Stats() view.Stats
}

// ViewCollector is a prometheus.Collector over one view's Stats. Create
// one with NewView; it is safe for concurrent scrapes.
type ViewCollector struct {
	src ViewSource

	keys, bytes, revision, lag                         *prometheus.Desc
	relists, resyncs, decodeErrors, checks, mismatches *prometheus.Desc
	subscribers, historyBytes                          *prometheus.Desc
	restoreRefusals, saveFailures                      *prometheus.Desc
}

var _ prometheus.Collector = (*ViewCollector)(nil)

// NewView returns a ViewCollector over v, whose metrics carry the labels
// view="name" and range=r.String() (such as `keys ["config/",
// "config0")`), r being the range v was made with. Views of one state
// (view.View.Share) share the state's figures, but Subscribers and
// Resyncs are each View's own: register a ViewCollector for each View
// whose subscribers you count, under names of their own. Two
// ViewCollectors may share a registry if their names or ranges differ.
// The ViewCollector reads v at each scrape, for as long as it is
// registered: after v is closed its values stay as they were, so
// unregister the ViewCollector when its view is closed.
func NewView(name string, r etcdwatch.Request, v ViewSource) *ViewCollector {
	labels := prometheus.Labels{"view": name, "range": r.String()}
	desc := func(metric, help string) *prometheus.Desc {
		return prometheus.NewDesc("etcdwatch_view_"+metric, help, nil, labels)
	}
	return &ViewCollector{
		src:          v,
		keys:         desc("keys", "Keys in the view."),
		bytes:        desc("bytes", "Bytes of the view's keys and values as stored."),
		revision:     desc("revision", "The view's revision: every change of its range up to it is applied."),
		lag:          desc("lag_revisions", "The highest revision its Stream has seen minus the view's revision."),
		relists:      desc("relists_total", "Listings of the range that replaced a state (a restored one too): after compactions, and repairs."),
		resyncs:      desc("resyncs_total", "Whole states given to subscribers that fell behind the history."),
		decodeErrors: desc("decode_errors_total", "Values the view's decode function refused."),
		checks:       desc("integrity_checks_total", "Comparisons of the view with the server completed."),
		mismatches:   desc("integrity_mismatches_total", "Comparisons that found the view wrong, each repaired by a relist."),
		subscribers:  desc("subscribers", "Open subscriptions to the view's changes."),
		historyBytes: desc("history_bytes", "Bytes of changes kept for subscribers."),
		restoreRefusals: desc("restore_refusals_total",
			"Saved states not used at a warm start (corrupt, another format, range or cluster, ahead of the cluster, or let go when the server failed the start from it): the view listed instead."),
		saveFailures: desc("save_failures_total", "Saves of the view's state (WithStateFile) that failed."),
	}
}

// Describe sends the descriptors of every metric the ViewCollector sends.
func (c *ViewCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.keys, c.bytes, c.revision, c.lag,
		c.relists, c.resyncs, c.decodeErrors, c.checks, c.mismatches,
		c.subscribers, c.historyBytes,
		c.restoreRefusals, c.saveFailures,
	} {
		ch <- d
	}
}

// Collect reads the view's Stats once and sends them as metrics.
func (c *ViewCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.src.Stats()
	out := sender(ch)
	out.gauge(c.keys, float64(st.Keys))
	out.gauge(c.bytes, float64(st.Bytes))
	out.gauge(c.revision, float64(st.Revision))
	out.gauge(c.lag, float64(st.Lag))
	out.counter(c.relists, st.Relists)
	out.counter(c.resyncs, st.Resyncs)
	out.counter(c.decodeErrors, st.DecodeErrors)
	out.counter(c.checks, st.IntegrityChecks)
	out.counter(c.mismatches, st.IntegrityMismatches)
	out.gauge(c.subscribers, float64(st.Subscribers))
	out.gauge(c.historyBytes, float64(st.HistoryBytes))
	out.counter(c.restoreRefusals, st.RestoreRefusals)
	out.counter(c.saveFailures, st.SaveFailures)
}
