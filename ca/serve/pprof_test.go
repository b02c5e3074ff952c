package serve_test

import (
	"net/http"
	"testing"
)

// TestPprof: /debug/pprof/ is on the admin listener only with EnablePprof,
// beside the admin endpoints.
func TestPprof(t *testing.T) {
	for _, enabled := range []bool{false, true} {
		c := config(t)
		c.EnablePprof = enabled
		p := start(t, c)
		for path, want := range map[string]int{"/debug/pprof/": http.StatusNotFound, "/debug/pprof/heap": http.StatusNotFound, "/healthz": http.StatusOK} {
			if enabled && path != "/healthz" {
				want = http.StatusOK
			}
			r, err := http.Get("http://" + p.Addresses().Admin + path)
			if err != nil {
				t.Fatal(err)
			}
			r.Body.Close()
			if r.StatusCode != want {
				t.Errorf("EnablePprof %v: GET %s: %s, want %d", enabled, path, r.Status, want)
			}
		}
	}
}
