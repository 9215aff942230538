package group_test

import (
	"context"
	"fmt"
	"log"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/dial"
	"github.com/etcdwatch/etcdwatch/group"
	"github.com/etcdwatch/etcdwatch/view"
)

// A group over a 3-member cluster: one Stream on each member, a prefix
// watched on the least loaded one, a heavy range on a Stream of its own, a
// view, and where each Stream is. (No output: it needs a cluster.)
func ExampleDial() {
	ctx := context.Background()
	g, err := group.Dial([]string{"10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"},
		group.WithDialOptions(dial.WithInsecure()))
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()

	w, err := g.Watch(ctx, etcdwatch.Prefix("app/"))
	if err != nil {
		log.Fatal(err)
	}
	registry, err := g.WatchPinned(ctx, etcdwatch.Prefix("registry/").FromRevision(1))
	if err != nil {
		log.Fatal(err)
	}
	defer registry.Cancel()
	config, err := view.New(ctx, g, etcdwatch.Prefix("config/"), view.DecodeBytes)
	if err != nil {
		log.Fatal(err)
	}
	defer config.Close()

	for _, s := range g.Streams() {
		fmt.Printf("stream %s on %s: %d watches, connected %v\n", s.Name, s.Member, s.Stats.Watches, s.State.Connected)
	}
	for r := range w.Responses() {
		for _, e := range r.Events {
			fmt.Println(e.Type, string(e.Key), string(e.Value))
		}
	}
}
