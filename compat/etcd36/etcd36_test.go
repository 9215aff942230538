// Package etcd36 runs the shared scenarios against etcd 3.6.16, built from
// the module in ./server (pinned to that release) and started as a child
// process: etcd's 3.6 API module cannot be linked beside the one etcdwatch
// needs, so the server cannot run in the test process.
package etcd36

import (
	"os"
	"testing"

	"github.com/etcdwatch/etcdwatch/compat/scenarios"
)

// bin is the server binary TestMain built.
var bin string

func TestMain(m *testing.M) { os.Exit(scenarios.MainBuilt(m, "server", &bin)) }

func TestEtcd36(t *testing.T) { scenarios.RunBuilt(t, bin, "3.6.16") } // the release ./server/go.mod pins
