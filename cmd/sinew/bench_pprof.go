package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"
)

// pprofListenEnv names the environment variable that, when set to a loopback
// address, makes any sinew command serve Go's profiling endpoints
// (/debug/pprof/...) there. It exists so `sinew bench` and bench/compare can take a
// CPU profile of `sinew serve` under load; it is off unless asked for, and it
// refuses addresses other than loopback because profiles reveal memory contents.
const pprofListenEnv = "SINEW_PPROF_LISTEN"

func init() {
	addr := os.Getenv(pprofListenEnv)
	if addr == "" {
		return
	}
	if err := startPprof(addr); err != nil {
		fmt.Fprintf(os.Stderr, "sinew: %s: %v\n", pprofListenEnv, err)
	}
}

// startPprof serves the profiling handlers on addr, on their own mux so they never
// appear on the admin listener.
func startPprof(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("%q is not a loopback address", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }() // lives as long as the process; nothing to clean up
	return nil
}
