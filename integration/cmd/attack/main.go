// Command attack runs integration/harness/attack against meshca replicas
// as a process of its own, as a hostile Pod would: every attack at once
// from one or more source addresses, until SIGTERM or SIGINT. It prints
// what it holds as one JSON line every -every, and a last one, with
// "final": true, once it has closed everything.
//
//	go run ./cmd/attack -grpc 127.0.0.1:15012 -admin 127.0.0.1:15014 -from 127.0.2.1 -sources 16
//
// The soak test (integration/e2e/soak_test.go, make soak) builds and
// runs it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/meshca/meshca/integration/harness/hostile"
)

func main() {
	var c hostile.Config
	grpcAddrs := flag.String("grpc", "", "the replicas' gRPC addresses, comma-separated")
	admin := flag.String("admin", "", "the replicas' admin addresses, comma-separated")
	from := flag.String("from", "127.0.0.1", "the first source address")
	sources := flag.Int("sources", 1, "source addresses, consecutive from -from")
	kinds := flag.String("kinds", "all", "attacks, comma-separated: half-open, watch, silent-tcp, half-tls, admin-idle, or all")
	flag.IntVar(&c.Slots, "slots", hostile.DefaultSlots, "connections of each gRPC attack from each source to each replica")
	flag.IntVar(&c.AdminSlots, "admin-slots", hostile.DefaultAdminSlots, "idle admin connections to each replica, over all sources")
	flag.IntVar(&c.WatchName, "watch-name", hostile.DefaultWatchName, "bytes of each Watch's service name")
	flag.Float64Var(&c.DialRate, "dial-rate", hostile.DefaultDialRate, "connections a second each attack opens")
	flag.Float64Var(&c.StreamRate, "stream-rate", hostile.DefaultStreamRate, "half-open streams a second")
	flag.Float64Var(&c.WatchRate, "watch-rate", hostile.DefaultWatchRate, "Watch streams a second")
	every := flag.Duration("every", time.Second, "how often to print what is held")
	flag.Parse()
	var err error
	if c.Kinds, err = hostile.ParseKinds(*kinds); err == nil {
		c.From, err = addresses(*from, *sources)
	}
	c.GRPC, c.Admin = split(*grpcAddrs), split(*admin)
	if err == nil {
		err = raiseNoFile(c.Conns() + 1024)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "attack:", err)
		os.Exit(2)
	}
	a, err := hostile.New(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "attack:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run(ctx, a, *every)
}

// run attacks until ctx ends, printing a line every period.
func run(ctx context.Context, a *hostile.Attacker, every time.Duration) {
	start := time.Now()
	enc := json.NewEncoder(os.Stdout)
	emit := func(final bool) {
		_ = enc.Encode(hostile.Line{Elapsed: hostile.Duration(time.Since(start).Round(time.Millisecond)), Final: final, Kinds: a.Snapshot()})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.Run(ctx)
	}()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-done:
			emit(true)
			return
		case <-t.C:
			emit(false)
		}
	}
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// addresses are n consecutive IPv4 addresses from first.
func addresses(first string, n int) ([]net.IP, error) {
	ip := net.ParseIP(first).To4()
	if ip == nil || n < 1 || int(ip[3])+n > 255 {
		return nil, fmt.Errorf("-from %q -sources %d: want an IPv4 address and that many after it in its /24", first, n)
	}
	out := make([]net.IP, n)
	for i := range out {
		out[i] = net.IPv4(ip[0], ip[1], ip[2], ip[3]+byte(i))
	}
	return out, nil
}

// raiseNoFile raises the open-file limit to n, refusing to start if the
// hard limit is lower: a run out of descriptors measures the attacker.
func raiseNoFile(n int) error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return err
	}
	if l.Cur >= uint64(n) {
		return nil
	}
	if l.Max < uint64(n) {
		return fmt.Errorf("the attack holds up to %d connections; RLIMIT_NOFILE's hard limit is %d: lower -slots or -admin-slots", n-1024, l.Max)
	}
	l.Cur = uint64(n)
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
}
