// Package etcd37 runs the shared scenarios against the embedded etcd 3.7
// (etcdwatchtest), the release the root module's API dependency comes
// from. internal/e2e covers the same ground and more on that server; this
// package runs the very code the older servers run.
package etcd37

import (
	"fmt"
	"os"
	"testing"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/goleak"

	"github.com/etcdwatch/etcdwatch/compat/scenarios"
	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

var etcd *etcdwatchtest.Server

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "etcdwatch-etcd37-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	etcd, err = etcdwatchtest.StartEtcdIn(dir, func(c *embed.Config) { c.MaxRequestBytes = scenarios.MaxRequestBytes })
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	etcd.Stop()
	if code == 0 {
		if err := goleak.Find(etcdwatchtest.LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

func TestEtcd37(t *testing.T) {
	if v := scenarios.Run(t, etcd.Endpoint); v.Major != 3 || v.Minor != 7 {
		t.Errorf("the embedded server reports etcd %s, want 3.7.x", v)
	}
}
