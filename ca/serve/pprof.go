package serve

import (
	"net/http"
	"net/http/pprof"
)

// withPprof serves Go's runtime profiles under /debug/pprof/ beside h
// (Config.EnablePprof). They reveal the program's internals and cost CPU
// while a profile runs: off by default, and only ever on the admin port.
func withPprof(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/", h)
	return mux
}
