package kube

import "testing"

// FuzzTokenExpiry: any bearer token's claims are read without panicking.
func FuzzTokenExpiry(f *testing.F) {
	f.Add("a.eyJleHAiOjE3MDAwMDAwMDB9.c")
	f.Add("...")
	f.Fuzz(func(t *testing.T, tok string) { _ = tokenExpiry(tok) })
}
