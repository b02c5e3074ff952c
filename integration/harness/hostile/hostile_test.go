package hostile_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness/hostile"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// servers are a gRPC server over TLS (a CA service that waits for its
// message, and the health service) with 8 streams a connection, and an
// admin HTTP server, as meshca's listeners are.
type servers struct{ grpc, admin string }

func startServers(t *testing.T, ca bool) servers {
	t.Helper()
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{selfSigned(t)}})),
		grpc.MaxConcurrentStreams(8))
	if ca {
		authpb.RegisterIstioCertificateServiceServer(g, authpb.UnimplementedIstioCertificateServiceServer{})
	}
	healthpb.RegisterHealthServer(g, health.NewServer())
	gl := listen(t)
	go g.Serve(gl)
	t.Cleanup(g.Stop)
	al := listen(t)
	admin := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })}
	go admin.Serve(al)
	t.Cleanup(func() { admin.Close() })
	return servers{grpc: gl.Addr().String(), admin: al.Addr().String()}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{hostile.DefaultServerName}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// refuser accepts connections and closes them at once, as a connection
// cap does.
func refuser(t *testing.T) string {
	t.Helper()
	l := listen(t)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
	}()
	return l.Addr().String()
}

var from = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(127, 0, 0, 2)}

func TestAttacker(t *testing.T) {
	tests := []struct {
		name   string
		config func(t *testing.T) hostile.Config
		// want holds once the attack is where it should be.
		want func(hostile.Snapshot) bool
	}{
		{name: "holds every connection and stream the servers let in",
			config: func(t *testing.T) hostile.Config {
				s := startServers(t, true)
				return hostile.Config{GRPC: []string{s.grpc}, Admin: []string{s.admin}, AdminSlots: 4}
			},
			want: func(s hostile.Snapshot) bool {
				// 2 addresses × 2 slots; 8 streams each.
				return s["half-open"].StreamsHeld == 32 && s["watch"].StreamsHeld == 32 && s["silent-tcp"].Held == 4 &&
					s["half-tls"].Held == 4 && s["admin-idle"].Held == 4 && s["half-open"].Held == 4 && s["watch"].Held == 4
			}},
		{name: "re-opens the streams the server ends",
			config: func(t *testing.T) hostile.Config {
				s := startServers(t, false) // CreateCertificate is Unimplemented at once
				return hostile.Config{GRPC: []string{s.grpc}, Kinds: []hostile.Kind{hostile.HalfOpen}, StreamRate: 200}
			},
			want: func(s hostile.Snapshot) bool {
				c := s["half-open"]
				return c.Held == 4 && c.StreamsClosed >= 100 && c.Refused == 0
			}},
		{name: "counts the connections the server refuses",
			config: func(t *testing.T) hostile.Config {
				addr := refuser(t)
				return hostile.Config{GRPC: []string{addr}, Admin: []string{addr}, AdminSlots: 4}
			},
			want: func(s hostile.Snapshot) bool {
				for _, c := range s {
					if c.Refused < 8 || c.HeldMax > 0 {
						return false
					}
				}
				return true
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.config(t)
			cfg.From, cfg.Slots, cfg.DialRate = from, 2, 1000
			a, err := hostile.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = a.Run(ctx)
			}()
			deadline := time.Now().Add(10 * time.Second)
			for !tt.want(a.Snapshot()) {
				if time.Now().After(deadline) {
					cancel()
					<-done
					t.Fatalf("after 10 s: %+v", a.Snapshot())
				}
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
			<-done
			for kind, c := range a.Snapshot() {
				if c.Held != 0 || c.StreamsHeld != 0 || c.LocalErrors != 0 {
					t.Errorf("%s once stopped: %+v, want nothing held and no failure of its own", kind, c)
				}
			}
		})
	}
}
