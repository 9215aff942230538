// Package etcdwatchprom exports the counters and state of etcdwatch Streams
// and of their views (package view) as Prometheus metrics.
//
// A Collector reads Stream.Stats and Stream.State when it is scraped, and a
// ViewCollector a view's Stats: they run no goroutine and keep no copy, so
// a scrape always shows the values of that moment. Each Collector carries a
// constant label, stream, naming its Stream, and each ViewCollector two,
// view naming the view and range its range, so that the Streams and views
// of one program can be registered together:
//
//	reg.MustRegister(etcdwatchprom.New("config", configStream))
//	reg.MustRegister(etcdwatchprom.New("leases", leaseStream))
//	reg.MustRegister(etcdwatchprom.NewView("flags", etcdwatch.Prefix("flags/"), flagsView))
//
// A GroupCollector (NewGroup) does the same for each Stream of a group of
// Streams (package group), labelled stream="name/0", "name/1" and so on,
// and "name/pinned" for its pinned Streams together, with one more
// metric, etcdwatch_member_info, saying which member each Stream is on:
//
//	reg.MustRegister(etcdwatchprom.NewGroup("watchers", g))
//
// The metrics of a Stream, all prefixed etcdwatch_, and the fields they come
// from:
//
//	etcdwatch_watches                         gauge    Stats.Watches: watches running now (creating, active or paused)
//	etcdwatch_paused_watches                  gauge    Stats.Paused: watches paused now because their consumer fell behind
//	etcdwatch_creates_total                   counter  Stats.Created: created responses accepted, resumes included
//	etcdwatch_stalls_total                    counter  Stats.Stalls: times the stream waited for a consumer at its buffer limit
//	etcdwatch_pauses_total                    counter  Stats.Pauses: times a watch was paused
//	etcdwatch_resumes_total                   counter  Stats.Resumes: times a paused watch was re-created
//	etcdwatch_responses_total                 counter  Stats.Responses: responses received from the server
//	etcdwatch_events_total                    counter  Stats.Events: events queued for consumers
//	etcdwatch_fragments_total                 counter  Stats.Fragments: fragment responses joined into whole revisions
//	etcdwatch_duplicates_dropped_total        counter  Stats.DuplicatesDropped: events at or below a watch's revision, dropped (but for a revision asked for again on a resume)
//	etcdwatch_unknown_responses_total         counter  Stats.UnknownResponses: responses for watch ids the stream did not know
//	etcdwatch_reconnects_total                counter  Stats.Reconnects: gRPC streams replaced after they ended
//	etcdwatch_watches_moved_total             counter  Stats.Moved: watches re-created on a new stream after a reconnect
//	etcdwatch_ids_rewritten                   gauge    Stats.IDsRewritten: 1 if the server chose its own watch ids (a gRPC proxy)
//	etcdwatch_revision                        gauge    Stats.Revision: the highest revision the server has reported
//	etcdwatch_last_message_timestamp_seconds  gauge    Stats.LastMessage, Unix time; absent before the first response
//	etcdwatch_connected                       gauge    State.Connected: 1 while the server answers on the Watch stream
//	etcdwatch_state_since_timestamp_seconds   gauge    State.Since: when etcdwatch_connected last changed, Unix time
//	etcdwatch_last_error_timestamp_seconds    gauge    State.LastErrorAt, Unix time; absent before the first error
//	etcdwatch_failed                          gauge    State.Failed: 1 once the Watch stream failed for good; replace the Stream
//	etcdwatch_member_info                     gauge    a group's Streams only: 1, labelled member with the address of the member its Watch RPC is on (group.StreamInfo.Member); absent while on none
//
// The last error itself, and why a stream failed, are not exported: their
// text varies without bound, which a label must not. Log them
// (etcdwatch.WithLogger) or show State in a health check instead.
//
// Alerts worth having: etcdwatch_failed == 1 (nothing comes back without
// a new Stream), rate(etcdwatch_reconnects_total[5m]) above the usual,
// etcdwatch_connected == 0 for longer than an outage you tolerate,
// and rate(etcdwatch_pauses_total[5m]) > 0, a consumer that cannot keep up.
// On a connection without gRPC keepalive (a clientv3 Client's, unless its
// Config sets DialKeepAliveTime) a dead connection is never closed: the
// liveness probe gives up each silent stream and opens another on it.
// etcdwatch_connected drops to 0 at the first and stays there until a
// server answers again, while reconnects climb and
// etcdwatch_last_message_timestamp_seconds stands still. Keepalive is the
// cure.
//
// The metrics of a view, all prefixed etcdwatch_view_, from view.Stats:
//
//	etcdwatch_view_keys                        gauge    Keys: keys in the view
//	etcdwatch_view_bytes                       gauge    Bytes: bytes of those keys and values as stored
//	etcdwatch_view_revision                    gauge    Revision: every change of the range up to it is applied
//	etcdwatch_view_lag_revisions               gauge    Lag: the highest revision the Stream has seen minus Revision
//	etcdwatch_view_relists_total               counter  Relists: listings that replaced a state (compactions, repairs)
//	etcdwatch_view_resyncs_total               counter  Resyncs: whole states given to subscribers that fell behind
//	etcdwatch_view_decode_errors_total         counter  DecodeErrors: values the decode function refused
//	etcdwatch_view_integrity_checks_total      counter  IntegrityChecks: comparisons with the server completed
//	etcdwatch_view_integrity_mismatches_total  counter  IntegrityMismatches: comparisons that found the view wrong
//	etcdwatch_view_subscribers                 gauge    Subscribers: open subscriptions
//	etcdwatch_view_history_bytes               gauge    HistoryBytes: bytes of changes kept for subscribers
//	etcdwatch_view_restore_refusals_total      counter  RestoreRefusals: saved states not used at a warm start
//	etcdwatch_view_save_failures_total         counter  SaveFailures: saves to WithStateFile's file that failed
//
// A program has few views, so the range label's values are few. A range
// nobody writes lags until its next bookmark (view.WithBookmarkInterval),
// so alert on etcdwatch_view_lag_revisions staying high rather than on
// its value at one scrape; rate(etcdwatch_view_relists_total[1h]) above
// the usual and any increase of etcdwatch_view_integrity_mismatches_total
// or etcdwatch_view_decode_errors_total are worth a look.
package etcdwatchprom

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/etcdwatch/etcdwatch"
)

// Source is what a Collector reads. *etcdwatch.Stream implements it; a
// test may pass its own.
type Source interface {
	Stats() etcdwatch.Stats
	State() etcdwatch.State
}

// Collector is a prometheus.Collector over one Stream's Stats and State.
// Create one with New; it is safe for concurrent scrapes.
type Collector struct {
	src Source

	watches, paused                        *prometheus.Desc
	creates, stalls, pauses, resumes       *prometheus.Desc
	responses, events, fragments           *prometheus.Desc
	duplicates, unknown, reconnects, moved *prometheus.Desc
	idsRewritten, revision, lastMessage    *prometheus.Desc
	connected, stateSince, lastErrorAt     *prometheus.Desc
	failed                                 *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// New returns a Collector over src, whose metrics carry the label
// stream="name". Register it with a prometheus.Registerer; two Collectors
// may share a registry if their names differ (the same name twice is
// refused as a duplicate). The Collector reads src at each scrape, for as
// long as it is registered: after src is closed its counters keep their
// last values, so unregister the Collector when its Stream is closed.
func New(name string, src Source) *Collector {
	labels := prometheus.Labels{"stream": name}
	desc := func(metric, help string) *prometheus.Desc {
		return prometheus.NewDesc("etcdwatch_"+metric, help, nil, labels)
	}
	return &Collector{
		src:          src,
		watches:      desc("watches", "Watches running now: creating, active or paused."),
		paused:       desc("paused_watches", "Watches paused now because their consumer fell behind."),
		creates:      desc("creates_total", "Created responses accepted from the server, resumes included."),
		stalls:       desc("stalls_total", "Times the stream waited for a consumer at its buffer limit."),
		pauses:       desc("pauses_total", "Times a watch was paused because its consumer fell behind."),
		resumes:      desc("resumes_total", "Times a paused watch was re-created."),
		responses:    desc("responses_total", "Responses received from the server."),
		events:       desc("events_total", "Events queued for consumers."),
		fragments:    desc("fragments_total", "Fragment responses joined into whole revisions."),
		duplicates:   desc("duplicates_dropped_total", "Events at or below a watch's revision that were dropped."),
		unknown:      desc("unknown_responses_total", "Responses for watch ids the stream did not know."),
		reconnects:   desc("reconnects_total", "gRPC Watch streams replaced after they ended."),
		moved:        desc("watches_moved_total", "Watches re-created on a new stream after a reconnect, once it confirmed them."),
		idsRewritten: desc("ids_rewritten", "1 if the server chose its own watch ids (a gRPC proxy), else 0."),
		revision:     desc("revision", "How far the store is known to be: the highest revision the server has reported."),
		lastMessage:  desc("last_message_timestamp_seconds", "When the last response arrived, in Unix time."),
		connected:    desc("connected", "1 while the server answers on the Watch stream (State.Connected), else 0."),
		stateSince:   desc("state_since_timestamp_seconds", "When etcdwatch_connected last changed, in Unix time."),
		lastErrorAt:  desc("last_error_timestamp_seconds", "When the last error ended a Watch stream or kept one from opening, in Unix time."),
		failed:       desc("failed", "1 once the Watch stream failed for good (State.Failed): its watches ended, new ones are refused; else 0."),
	}
}

// Describe sends the descriptors of every metric the Collector may send.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.watches, c.paused,
		c.creates, c.stalls, c.pauses, c.resumes,
		c.responses, c.events, c.fragments,
		c.duplicates, c.unknown, c.reconnects, c.moved,
		c.idsRewritten, c.revision, c.lastMessage,
		c.connected, c.stateSince, c.lastErrorAt, c.failed,
	} {
		ch <- d
	}
}

// Collect reads the Stream's Stats and State and sends them as metrics.
// The two timestamps that may not exist yet, of the last message and of
// the last error, are left out until they do.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.send(sender(ch), c.src.Stats(), c.src.State())
}

// send sends st and state as the Collector's metrics.
func (c *Collector) send(out sender, st etcdwatch.Stats, state etcdwatch.State) {
	out.gauge(c.watches, float64(st.Watches))
	out.gauge(c.paused, float64(st.Paused))
	out.counter(c.creates, st.Created)
	out.counter(c.stalls, st.Stalls)
	out.counter(c.pauses, st.Pauses)
	out.counter(c.resumes, st.Resumes)
	out.counter(c.responses, st.Responses)
	out.counter(c.events, st.Events)
	out.counter(c.fragments, st.Fragments)
	out.counter(c.duplicates, st.DuplicatesDropped)
	out.counter(c.unknown, st.UnknownResponses)
	out.counter(c.reconnects, st.Reconnects)
	out.counter(c.moved, st.Moved)
	out.gauge(c.idsRewritten, boolValue(st.IDsRewritten))
	out.gauge(c.revision, float64(st.Revision))
	if !st.LastMessage.IsZero() {
		out.gauge(c.lastMessage, unixSeconds(st.LastMessage))
	}
	out.gauge(c.connected, boolValue(state.Connected))
	out.gauge(c.stateSince, unixSeconds(state.Since))
	if !state.LastErrorAt.IsZero() {
		out.gauge(c.lastErrorAt, unixSeconds(state.LastErrorAt))
	}
	out.gauge(c.failed, boolValue(state.Failed != nil))
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// unixSeconds is t in Unix seconds, with its fraction.
func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// sender sends the metrics of one Collect.
type sender chan<- prometheus.Metric

func (s sender) gauge(d *prometheus.Desc, v float64) {
	s <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
}

func (s sender) counter(d *prometheus.Desc, v uint64) {
	s <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
}
