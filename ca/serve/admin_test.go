package serve_test

import (
	"net"
	"net/http"
	"testing"
	"time"
)

// TestAssembleAdminBindsOneAddress: an admin address with a host (what
// --admin-bind-address makes of the Pod's IP) is served on that address
// alone: /healthz answers there, and the same port on another address of
// the host refuses the connection.
func TestAssembleAdminBindsOneAddress(t *testing.T) {
	c := config(t)
	c.AdminListen = "127.0.0.2:0"
	p := start(t, c)
	host, port, err := net.SplitHostPort(p.Addresses().Admin)
	if err != nil || host != "127.0.0.2" {
		t.Fatalf("admin bound %q (%v), want 127.0.0.2", p.Addresses().Admin, err)
	}
	r, err := http.Get("http://" + net.JoinHostPort(host, port) + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Fatalf("/healthz on 127.0.0.2: %s", r.Status)
	}
	if conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), 2*time.Second); err == nil {
		conn.Close()
		t.Fatalf("127.0.0.1:%s accepted a connection: the admin server listens beyond 127.0.0.2", port)
	}
}
