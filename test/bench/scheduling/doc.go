// Package scheduling holds the end-to-end scheduling benchmark: a real kube-apiserver
// and etcd, a real manager running the scheduler, and a thousand ModelReplicas bound
// onto a hundred MacNodes, timed against creating the same objects with no scheduler.
//
// Reproduce (needs the envtest binaries, see `make envtest`):
//
//	go test -run '^$' -bench BenchmarkBind -benchtime 1x ./test/bench/scheduling/
package scheduling
