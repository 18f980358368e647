// Package runnerproc runs the engine pool's runners as processes: it implements
// enginepool.RunnerFactory and enginepool.Runner (and enginepool.Detacher) with macfleet-runner
// processes. It owns their whole life cycle — start (process.go: the command line in
// runnerArgs, the engine's flags in engineArgs), the sandbox they run in
// (process_sandbox.go), their output and exit (process_runner.go, procwatch_*.go),
// errors (process_errors.go), stop (process_stop.go) and span relay
// (process_spans.go) — the adoption of runners that outlived an agent restart
// (adopt.go), and the prompt cache directories they are given (cachedir.go,
// cachedir_prune.go).
//
// The pool (package enginepool) knows none of this: it sees a RunnerFactory that starts
// a Runner. This package imports metal for those interfaces and for ModelSpec; metal
// never imports it.
package runnerproc
