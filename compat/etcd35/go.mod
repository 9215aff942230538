module github.com/etcdwatch/etcdwatch/compat/etcd35

go 1.26.0

replace (
	github.com/etcdwatch/etcdwatch => ../..
	github.com/etcdwatch/etcdwatch/compat/scenarios => ../scenarios
)

require github.com/etcdwatch/etcdwatch/compat/scenarios v0.0.0-00010101000000-000000000000

require (
	github.com/etcdwatch/etcdwatch v0.0.0-00010101000000-000000000000 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.29.0 // indirect
	go.etcd.io/etcd/api/v3 v3.7.3 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260803160001-6ac0973c030d // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260803160001-6ac0973c030d // indirect
	google.golang.org/grpc v1.83.2 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)
