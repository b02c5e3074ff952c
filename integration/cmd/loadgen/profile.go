package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"

	"github.com/meshca/meshca/integration/load"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
)

// profileLoad runs one more load level while it takes meshca's CPU
// profile and this client's, and meshca's allocation profile before and
// after, into o.profile; it prints the top entries of each.
func profileLoad(o options, t load.Target, token string, reqs []*authpb.IstioCertificateRequest, admin string, raw load.Raw) error {
	if err := os.MkdirAll(o.profile, 0o755); err != nil {
		return err
	}
	path := func(name string) string { return filepath.Join(o.profile, name) }
	before, after, cpu, client := path("meshca-allocs-before.pb.gz"), path("meshca-allocs-after.pb.gz"), path("meshca-cpu.pb.gz"), path("client-cpu.pb.gz")
	conns, err := t.DialN(o.profileConns, token, reqs[0])
	if err != nil {
		return err
	}
	defer load.CloseAll(conns)
	if err := load.Fetch(admin, "/debug/pprof/allocs", before); err != nil {
		return err
	}
	secs := max(1, int(o.profileFor/time.Second))
	done := make(chan *load.Sample, 1)
	go func() {
		done <- load.Sustain(o.profileStreams, func(stream, i int) error {
			return conns[stream%len(conns)].Call(reqs[i%len(reqs)])
		}, o.warmup, time.Duration(secs)*time.Second+time.Second, nil)
	}()
	time.Sleep(o.warmup)
	f, err := os.Create(client)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	err = load.Fetch(admin, fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs), cpu)
	pprof.StopCPUProfile()
	s := <-done
	if err != nil {
		return err
	}
	if err := load.Fetch(admin, "/debug/pprof/allocs", after); err != nil {
		return err
	}
	fmt.Printf("\nprofiles of %d streams over %d connections for %ds (%.0f req/s while profiled, %d failed) in %s\n",
		o.profileStreams, o.profileConns, secs, s.Rate(), s.Errs, o.profile)
	shares, err := load.Breakdown(load.MeshcaCategories, cpu)
	if err != nil {
		return err
	}
	fmt.Printf("\nwhere meshca's CPU goes (the raw work alone, measured here: %.0f µs/op)\n", float64(raw.CPU.Nanoseconds())/1000)
	load.PrintBreakdown(os.Stdout, shares, int(s.Rate()*float64(secs)))
	for _, p := range []struct {
		title string
		args  []string
	}{
		{"meshca CPU", []string{"-top", "-nodecount=25", cpu}},
		{"meshca allocations (bytes) under load", []string{"-top", "-nodecount=20", "-sample_index=alloc_space", "-base", before, after}},
		{"client CPU", []string{"-top", "-nodecount=15", client}},
	} {
		if err := load.Top(os.Stdout, p.title, p.args...); err != nil {
			return err
		}
	}
	return nil
}
