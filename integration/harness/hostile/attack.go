// Package hostile holds a CA's resources the way one hostile Pod without
// any credentials can: half-open CreateCertificate streams, health
// Watches with long service names, silent TCP connections, TLS
// handshakes that stop halfway and idle keep-alives to the admin port,
// from one or many source addresses, re-opening whatever the server
// closes. It counts what the server let it hold and for how long.
//
// Every (re)connection and every stream it opens waits for its attack's
// rate: the attacker shares the machine's cores with the server it
// measures, and a flood of handshakes measures the cores, not the
// server's bounds on what an unauthenticated peer may hold.
// cmd/attack runs it as a process of its own; the soak test
// (integration/e2e/soak_test.go) drives that.
package hostile

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Kind is one way of holding a server's resources without credentials.
type Kind int

const (
	// HalfOpen opens CreateCertificate streams (TLS, HTTP/2, HEADERS)
	// and never sends their message.
	HalfOpen Kind = iota
	// Watch opens grpc.health.v1.Health/Watch streams for a service
	// name of Config.WatchName bytes and keeps them open.
	Watch
	// SilentTCP opens TCP connections that never start TLS.
	SilentTCP
	// HalfTLS sends a ClientHello and then nothing.
	HalfTLS
	// AdminIdle makes one HTTP/1.1 request on a keep-alive connection
	// to the admin port and leaves the connection idle.
	AdminIdle
	numKinds
)

var kindNames = [numKinds]string{"half-open", "watch", "silent-tcp", "half-tls", "admin-idle"}

func (k Kind) String() string {
	if k < 0 || k >= numKinds {
		return fmt.Sprintf("Kind(%d)", int(k))
	}
	return kindNames[k]
}

// ParseKinds parses a comma-separated list of kind names; "all" is
// every kind.
func ParseKinds(s string) ([]Kind, error) {
	if s == "all" || s == "" {
		return Kinds(), nil
	}
	var out []Kind
	for _, name := range strings.Split(s, ",") {
		found := false
		for k := range numKinds {
			if kindNames[k] == strings.TrimSpace(name) {
				out, found = append(out, k), true
			}
		}
		if !found {
			return nil, fmt.Errorf("hostile: unknown kind %q (want %s or all)", name, strings.Join(kindNames[:], ", "))
		}
	}
	return out, nil
}

// Kinds is every kind.
func Kinds() []Kind {
	out := make([]Kind, numKinds)
	for k := range numKinds {
		out[k] = k
	}
	return out
}

// Config is what to attack, from where, and how hard.
type Config struct {
	// GRPC and Admin are each replica's gRPC (TLS) and admin (HTTP)
	// addresses, host:port.
	GRPC, Admin []string
	// From are the source addresses (any 127/8 address on Linux's
	// loopback).
	From []net.IP
	// Kinds are the attacks run at once; every kind when empty.
	Kinds []Kind
	// Slots is how many connections each attack on the gRPC port keeps
	// open, or tries to, from each source address to each replica: more
	// than the server's per-address cap lets in, so that the attacks
	// together always press on it.
	Slots int
	// AdminSlots is how many idle connections AdminIdle keeps to each
	// replica's admin port, spread over the source addresses.
	AdminSlots int
	// MaxStreams bounds the streams of a connection when the server
	// sets no SETTINGS_MAX_CONCURRENT_STREAMS; otherwise its value is
	// used.
	MaxStreams int
	// WatchName is the length of each Watch's service name.
	WatchName int
	// DialRate is the connections a second each attack opens, over all
	// its sources and replicas; StreamRate the HalfOpen streams, and
	// WatchRate the Watch streams, a second.
	DialRate, StreamRate, WatchRate float64
	// ServerName is the TLS server name sent.
	ServerName string
}

// Defaults of Config's zero fields.
const (
	DefaultSlots      = 80
	DefaultAdminSlots = 1024
	DefaultMaxStreams = 1024
	DefaultWatchName  = 60 << 10
	DefaultDialRate   = 200
	DefaultStreamRate = 5000
	DefaultWatchRate  = 500
	DefaultServerName = "istiod.istio-system.svc"
)

func (c Config) withDefaults() Config {
	if len(c.Kinds) == 0 {
		c.Kinds = Kinds()
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	deff := func(v *float64, d float64) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Slots, DefaultSlots)
	def(&c.AdminSlots, DefaultAdminSlots)
	def(&c.MaxStreams, DefaultMaxStreams)
	def(&c.WatchName, DefaultWatchName)
	deff(&c.DialRate, DefaultDialRate)
	deff(&c.StreamRate, DefaultStreamRate)
	deff(&c.WatchRate, DefaultWatchRate)
	if c.ServerName == "" {
		c.ServerName = DefaultServerName
	}
	return c
}

// Conns is how many connections c opens at most at once: the file
// descriptors its process needs, besides a few of its own.
func (c Config) Conns() int {
	c = c.withDefaults()
	n := 0
	for _, k := range c.Kinds {
		if k == AdminIdle {
			n += len(c.Admin) * c.adminPerSource() * len(c.From)
		} else {
			n += len(c.GRPC) * len(c.From) * c.Slots
		}
	}
	return n
}

func (c Config) adminPerSource() int { return (c.AdminSlots + len(c.From) - 1) / len(c.From) }

// Attacker runs the attacks of a Config.
type Attacker struct {
	cfg     Config
	tls     *tls.Config
	hello   []byte
	stats   [numKinds]counts
	dials   [numKinds]*rate.Limiter
	streams [numKinds]*rate.Limiter
	watch   []byte // a Watch request's gRPC message
}

// New checks cfg and prepares the attacks; Run starts them.
func New(cfg Config) (*Attacker, error) {
	cfg = cfg.withDefaults()
	switch {
	case len(cfg.From) == 0:
		return nil, errors.New("hostile: no source address")
	case len(cfg.GRPC) == 0 && len(cfg.Admin) == 0:
		return nil, errors.New("hostile: no target")
	}
	a := &Attacker{cfg: cfg, tls: &tls.Config{
		InsecureSkipVerify: true, // an attacker trusts anything
		ServerName:         cfg.ServerName,
		NextProtos:         []string{"h2"},
		MinVersion:         tls.VersionTLS13,
		// The cheapest key exchange for the attacker's own cores.
		CurvePreferences: []tls.CurveID{tls.X25519},
	}}
	var err error
	if a.hello, err = clientHello(a.tls); err != nil {
		return nil, err
	}
	a.watch = watchMessage(cfg.WatchName)
	for k := range numKinds {
		a.dials[k] = rate.NewLimiter(rate.Limit(cfg.DialRate), max(1, int(cfg.DialRate/20)))
	}
	a.streams[HalfOpen] = rate.NewLimiter(rate.Limit(cfg.StreamRate), max(1, int(cfg.StreamRate/20)))
	a.streams[Watch] = rate.NewLimiter(rate.Limit(cfg.WatchRate), max(1, int(cfg.WatchRate/20)))
	return a, nil
}

// Run attacks until ctx ends, then closes every connection it holds and
// returns once they are closed.
func (a *Attacker) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, k := range a.cfg.Kinds {
		targets, slots := a.cfg.GRPC, a.cfg.Slots
		if k == AdminIdle {
			targets, slots = a.cfg.Admin, a.cfg.adminPerSource()
		}
		for _, target := range targets {
			for _, from := range a.cfg.From {
				for range slots {
					wg.Go(func() { a.slot(ctx, k, target, from) })
				}
			}
		}
	}
	wg.Wait()
	return nil
}

// slot keeps one connection of kind k open from from to target,
// re-opening it whenever it ends, at the kind's rate.
func (a *Attacker) slot(ctx context.Context, k Kind, target string, from net.IP) {
	for a.dials[k].Wait(ctx) == nil {
		s := &a.stats[k]
		c := s.begin()
		est, err := a.session(ctx, k, target, from, c)
		s.end(c, est, ctx.Err() != nil, err)
	}
}

// session is one connection of kind k; it reports whether the
// connection was established (the server let it in) and why it ended.
func (a *Attacker) session(ctx context.Context, k Kind, target string, from net.IP, c *conn) (bool, error) {
	switch k {
	case HalfOpen, Watch:
		return a.h2(ctx, k, target, from, c)
	case SilentTCP:
		return a.silent(ctx, target, from, c)
	case HalfTLS:
		return a.halfTLS(ctx, target, from, c)
	default:
		return a.adminIdle(ctx, target, from, c)
	}
}

// dial opens a TCP connection from from to target, closed when ctx ends.
func dial(ctx context.Context, target string, from net.IP) (net.Conn, func() bool, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: from}, Timeout: 10 * time.Second, Control: bindNoPort}
	c, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return nil, nil, err
	}
	return c, context.AfterFunc(ctx, func() { c.Close() }), nil
}
