// Command server is etcd 3.6.16, built from its own module so that its
// version is pinned apart from the client's (etcd's API module of another
// line cannot be linked into one binary with etcdwatch). It takes etcd's
// own flags; the compat/etcd36 tests build it and run it as a child process.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
