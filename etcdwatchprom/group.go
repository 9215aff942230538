package etcdwatchprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/etcdwatch/etcdwatch/group"
)

// GroupSource is what a GroupCollector reads. *group.Group implements it;
// a test may pass its own.
type GroupSource interface {
	Streams() []group.StreamInfo
}

// GroupCollector is a prometheus.Collector over each Stream of a group
// (package group): the metrics of a Collector for each, and which member
// each is on. Create one with NewGroup; it is safe for concurrent scrapes.
type GroupCollector struct {
	src     GroupSource
	streams map[string]*groupStream // by StreamInfo.Name
}

// groupStream is the metrics of one Stream of the group.
type groupStream struct {
	*Collector
	member *prometheus.Desc
}

var _ prometheus.Collector = (*GroupCollector)(nil)

// NewGroup returns a GroupCollector over g, whose Streams are labelled
// stream="name/0", "name/1" and so on, and stream="name/pinned" for the
// pinned Streams together (their counters since the group opened, closed
// ones included, so that they never fall): the same metrics as New's,
// with the same label, so that Streams of groups and single Streams can
// share a registry and a dashboard. sum by () over stream=~"name/.*" is
// the group's total for the counters and the watch gauges, as
// group.Group.Stats is; for the revision and the last message's time,
// take max by () instead, as Stats does.
//
// One more metric says where each of the group's own Streams is:
//
//	etcdwatch_member_info  gauge  1, labelled member with the address of the member the Stream's Watch RPC is on; absent while it is on none
//
// NewGroup reads g.Streams once, for their names; a later scrape sends the
// Streams of those names. Two GroupCollectors may share a registry if
// their names differ. The GroupCollector reads g at each scrape, for as
// long as it is registered: unregister it when the group is closed.
func NewGroup(name string, g GroupSource) *GroupCollector {
	c := &GroupCollector{src: g, streams: map[string]*groupStream{}}
	for _, s := range g.Streams() {
		label := name + "/" + s.Name
		c.streams[s.Name] = &groupStream{
			Collector: New(label, nil),
			member: prometheus.NewDesc("etcdwatch_member_info",
				"1 for the member, by address, the Stream's Watch RPC is on.",
				[]string{"member"}, prometheus.Labels{"stream": label}),
		}
	}
	return c
}

// Describe sends the descriptors of every metric the GroupCollector may
// send.
func (c *GroupCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, s := range c.streams {
		s.Describe(ch)
		ch <- s.member
	}
}

// Collect reads the group's Streams once and sends each one's metrics.
func (c *GroupCollector) Collect(ch chan<- prometheus.Metric) {
	out := sender(ch)
	for _, info := range c.src.Streams() {
		s, ok := c.streams[info.Name]
		if !ok {
			continue
		}
		s.send(out, info.Stats, info.State)
		if info.Member != "" {
			out <- prometheus.MustNewConstMetric(s.member, prometheus.GaugeValue, 1, info.Member)
		}
	}
}
