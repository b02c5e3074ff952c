package serve

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
)

// TestServingCheck: the serving-cert readiness check fails once the
// served certificate has expired, and says, ready still, when less than
// a sixth of its lifetime is left or its files hold a refused pair.
func TestServingCheck(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	leaf := &x509.Certificate{NotBefore: start, NotAfter: start.Add(60 * time.Hour)}
	be := &backend{getCert: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &tls.Certificate{Leaf: leaf}, nil }}
	for _, tt := range []struct {
		name     string
		at       time.Duration // after start
		degraded bool
		fail     bool
		msg      string
	}{
		{name: "fresh", at: time.Hour},
		{name: "two thirds in", at: 41 * time.Hour},
		{name: "a sixth left", at: 50*time.Hour + time.Second, degraded: true,
			msg: "the serving certificate expires at 2030-01-03T12:00:00Z, in 9h59m59s: renew it"},
		{name: "expired", at: 60*time.Hour + time.Second, fail: true,
			msg: "the serving certificate expired at 2030-01-03T12:00:00Z: clients refuse it"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := servingCheck(be, func() time.Time { return start.Add(tt.at) })()
			var d *ca.Degraded
			switch {
			case !tt.fail && !tt.degraded && err != nil:
				t.Fatalf("check = %v, want ok", err)
			case tt.degraded && (!errors.As(err, &d) || d.Error() != tt.msg):
				t.Fatalf("check = %v, want degraded: %s", err, tt.msg)
			case tt.fail && (err == nil || errors.As(err, &d) || err.Error() != tt.msg):
				t.Fatalf("check = %v, want failed: %s", err, tt.msg)
			}
		})
	}
	if err := servingCheck(&backend{getCert: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return nil, errors.New("none") }},
		time.Now)(); err == nil || !strings.Contains(err.Error(), "no serving certificate") {
		t.Fatalf("without a certificate: %v", err)
	}
}
