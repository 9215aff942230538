// Package group runs one set of watches and views over several
// etcdwatch Streams, and through them over several etcd members, with
// the API of one Stream: Watch, WatchAll, RequestProgress, Stats, State,
// Close, and view.Source, so that view.New takes a Group.
//
// One Stream carries its watches over one gRPC stream, served by one
// member's send loop. When that member fails, every watch moves at once;
// while one watch catches up, etcd answers no progress request for the
// others (etcd #20242). A Group keeps several Streams:
//
//	g, err := group.Dial([]string{"10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"},
//		group.WithDialOptions(dial.WithInsecure()))
//	if err != nil { ... }
//	defer g.Close()
//	w, err := g.Watch(ctx, etcdwatch.Prefix("app/"))        // on one of the Streams
//	big, err := g.WatchPinned(ctx, etcdwatch.Prefix("registry/")) // on a Stream of its own
//	v, err := view.New(ctx, g, etcdwatch.Prefix("config/"), view.DecodeBytes)
//
// Dial puts one Stream on each member, its home: the Stream moves to the
// next member when its home fails, or has no leader (with
// etcdwatch.WithRequireLeader), and goes back once the home has been up
// for a while (see Dial and WithHoming). New puts
// several on a connection the caller has, where its balancer sends them:
// often all on one member (see New), so that they keep their watches
// apart but fail together.
//
// # Placement
//
// Each watch goes to one Stream, chosen when it is opened:
//   - balanced by count, over members first: to the member with the fewest
//     watches, then to its Stream with the fewest;
//   - aware of health: a Stream that failed and is not answered again
//     (its member down, say) gets no new watch while another is healthy,
//     and one that failed for good (State.Failed) none while another has
//     not;
//   - pinned: WatchPinned, or a request that sets Isolated (a view's
//     watch does), gets a Stream of its own, closed when the watch ends.
//
// A watch stays on its Stream for its whole life: watches never move
// between Streams. When a member fails, only the Streams whose gRPC
// stream was on it reconnect, to another member, and their watches resume
// there, each from its own revision, with nothing lost or repeated, as a
// Stream's always do; the other Streams' watches deliver on meanwhile.
//
// # Counters
//
// Stats adds every Stream's counters together; Streams gives each
// Stream's, with the member it is on, and package etcdwatchprom's
// NewGroup exports them labelled by Stream.
package group
