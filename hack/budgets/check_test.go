package main

import (
	"slices"
	"strings"
	"testing"
)

const mod = "example.com/m"

// file builds a goFile whose imports are relative to mod, except "fmt"
// and paths with a dot in them.
func file(path string, test bool, imports ...string) goFile {
	f := goFile{Path: path, Test: test}
	for _, imp := range imports {
		if imp != "fmt" && !strings.Contains(imp, ".") {
			imp = mod + "/" + imp
		}
		f.Imports = append(f.Imports, imp)
	}
	return f
}

func pk(rel string, files ...goFile) pkg {
	return pkg{Path: mod + "/" + rel, Files: files}
}

// current is the shape of the tree the rules were written against.
var current = []pkg{
	pk("proto/istio/v1/auth", goFile{Path: "proto/istio/v1/auth/ca_grpc.pb.go", Generated: true,
		Imports: []string{"google.golang.org/grpc", statusImport}}),
	pk("internal/pemutil", file("internal/pemutil/pem.go", false, "fmt")),
	pk("internal/atomicfile", file("internal/atomicfile/f.go", false)),
	pk("internal/testca", file("internal/testca/ca.go", false, "keymgr")),
	pk("csr", file("csr/csr.go", false, "fmt"), file("csr/csr_test.go", true, "csr", "internal/benchbase")),
	pk("keymgr/certs", file("keymgr/certs/c.go", false, "fmt")),
	pk("keymgr", file("keymgr/k.go", false, "internal/atomicfile", "internal/pemutil", "keymgr/certs"),
		file("keymgr/k_test.go", true, "internal/testca", "keymgr")),
	pk("signer", file("signer/s.go", false, "csr")),
	pk("signer/local", file("signer/local/l.go", false, "keymgr", "keymgr/certs", "signer"),
		file("signer/local/l_test.go", true, "signer/signertest", "internal/testca")),
	pk("signer/cfssl", file("signer/cfssl/c.go", false, "csr", "internal/pemutil", "keymgr/certs", "signer"),
		file("signer/cfssl/c_test.go", true, "keymgr", "signer/signertest")),
	pk("signer/vault", file("signer/vault/v.go", false, "internal/pemutil", "keymgr/certs", "signer")),
	pk("signer/k8scsr", file("signer/k8scsr/k.go", false, "csr", "keymgr/certs", "signer")),
	pk("signer/k8scsr/k8scsrtest", file("signer/k8scsr/k8scsrtest/t.go", false, "csr", "keymgr", "keymgr/certs", "signer")),
	pk("signer/signertest", file("signer/signertest/t.go", false, "csr", "internal/testca", "keymgr", "signer")),
	pk("ca/kube", file("ca/kube/podindex.go", false)),
	pk("ca/caclient", file("ca/caclient/c.go", false, "csr", "internal/atomicfile", "proto/istio/v1/auth")),
	pk("ca", file("ca/errors.go", false, statusImport, "ca/kube", "csr", "signer", "proto/istio/v1/auth"),
		file("ca/server_test.go", true, statusImport, "ca/caclient", "signer/local", "keymgr")),
	pk("cmd/meshca", file("cmd/meshca/main.go", false, "ca", "ca/caclient", "signer/vault", "keymgr"),
		file("cmd/meshca/main_test.go", true, "ca")),
	pk("hack/budgets", file("hack/budgets/main.go", false, "fmt")),
}

// with returns current plus extra packages (appended files of a package
// already in current land in a package of their own, which is the same
// to the checks).
func with(extra ...pkg) []pkg { return append(slices.Clone(current), extra...) }

func TestCheckLayers(t *testing.T) {
	tests := []struct {
		name string
		pkgs []pkg
		want []string // one substring per expected violation, in order
	}{
		{name: "current tree", pkgs: current},
		{name: "csr imports signer", pkgs: with(pk("csr", file("csr/probe.go", false, "signer"))),
			want: []string{`csr/probe.go: package csr imports signer (layer "signer"); layer "csr" may import only [internal, csr]`}},
		{name: "csr imports keymgr", pkgs: with(pk("csr", file("csr/probe.go", false, "keymgr"))),
			want: []string{`package csr imports keymgr (layer "keymgr")`}},
		{name: "keymgr imports ca", pkgs: with(pk("keymgr", file("keymgr/probe.go", false, "ca"))),
			want: []string{`package keymgr imports ca (layer "ca"); layer "keymgr"`}},
		{name: "keymgr imports a backend", pkgs: with(pk("keymgr", file("keymgr/probe.go", false, "signer/vault"))),
			want: []string{`package keymgr imports signer/vault (layer "signer backend")`}},
		{name: "signer imports ca", pkgs: with(pk("signer", file("signer/probe.go", false, "ca"))),
			want: []string{`package signer imports ca (layer "ca"); layer "signer"`}},
		{name: "signer imports keymgr", pkgs: with(pk("signer", file("signer/probe.go", false, "keymgr"))),
			want: []string{`package signer imports keymgr`}},
		{name: "backend imports another", pkgs: with(pk("signer/local", file("signer/local/probe.go", false, "signer/cfssl"))),
			want: []string{`package signer/local imports signer/cfssl (layer "signer backend"); layer "signer/local"`}},
		{name: "backend imports local", pkgs: with(pk("signer/cfssl", file("signer/cfssl/probe.go", false, "signer/local"))),
			want: []string{`package signer/cfssl imports signer/local (layer "signer/local"); layer "signer backend"`}},
		{name: "cfssl imports keymgr", pkgs: with(pk("signer/cfssl", file("signer/cfssl/probe.go", false, "keymgr"))),
			want: []string{`package signer/cfssl imports keymgr (layer "keymgr"); layer "signer backend" may import only [internal, csr, keymgr/certs, signer, vaultauth]`}},
		{name: "vault imports keymgr", pkgs: with(pk("signer/vault", file("signer/vault/probe.go", false, "keymgr"))),
			want: []string{`package signer/vault imports keymgr (layer "keymgr"); layer "signer backend"`}},
		{name: "k8scsr imports keymgr/dirstore", pkgs: with(pk("signer/k8scsr", file("signer/k8scsr/probe.go", false, "keymgr/dirstore"))),
			want: []string{`package signer/k8scsr imports keymgr/dirstore (layer "keymgr"); layer "signer backend"`}},
		{name: "keymgr/certs imports keymgr", pkgs: with(pk("keymgr/certs", file("keymgr/certs/probe.go", false, "keymgr"))),
			want: []string{`package keymgr/certs imports keymgr (layer "keymgr"); layer "keymgr/certs" may import only [internal, csr]`}},
		{name: "backend imports signertest", pkgs: with(pk("signer/local", file("signer/local/probe.go", false, "signer/signertest"))),
			want: []string{`imports signer/signertest (layer "signertest")`}},
		{name: "ca/kube imports ca", pkgs: with(pk("ca/kube", file("ca/kube/probe.go", false, "ca"))),
			want: []string{`package ca/kube imports ca (layer "ca"); layer "ca part"`}},
		{name: "ca/caclient imports ca", pkgs: with(pk("ca/caclient", file("ca/caclient/probe.go", false, "ca"))),
			want: []string{`package ca/caclient imports ca (layer "ca")`}},
		{name: "ca/trust imports ca/kube and keymgr", pkgs: with(pk("ca/trust", file("ca/trust/t.go", false, "ca/kube", "keymgr", "signer")))},
		{name: "ca/podcert imports cmd", pkgs: with(pk("ca/podcert", file("ca/podcert/p.go", false, "cmd/meshca"))),
			want: []string{`package ca/podcert imports cmd/meshca (layer "cmd")`}},
		{name: "ca imports a backend", pkgs: with(pk("ca", file("ca/probe.go", false, "signer/vault"))),
			want: []string{`package ca imports signer/vault (layer "signer backend"); layer "ca"`}},
		{name: "ca imports the local backend", pkgs: with(pk("ca", file("ca/probe.go", false, "signer/local"))),
			want: []string{`package ca imports signer/local (layer "signer/local"); layer "ca"`}},
		{name: "proto imports csr", pkgs: with(pk("proto/istio/v1/auth", file("proto/istio/v1/auth/x.go", false, "csr"))),
			want: []string{`layer "proto" may import only nothing of ours`}},
		{name: "internal imports testca", pkgs: with(pk("internal/pemutil", file("internal/pemutil/x.go", false, "internal/testca"))),
			want: []string{`package internal/pemutil imports internal/testca (layer "internal/testca"); layer "internal"`}},
		{name: "internal imports keymgr", pkgs: with(pk("internal/atomicfile", file("internal/atomicfile/x.go", false, "keymgr"))),
			want: []string{`package internal/atomicfile imports keymgr`}},
		{name: "a test may import upward", pkgs: with(pk("csr", file("csr/x_test.go", true, "signer", "ca")))},
		{name: "a test must not import cmd", pkgs: with(pk("ca", file("ca/x_test.go", true, "cmd/meshca"))),
			want: []string{`ca/x_test.go: test of ca imports cmd/meshca (layer "cmd"); no code, tests included, may import layer "cmd"`}},
		{name: "cmd imports cmd", pkgs: with(pk("cmd/other", file("cmd/other/x.go", false, "cmd/meshca"))),
			want: []string{`package cmd/other imports cmd/meshca (layer "cmd")`}},
		{name: "package in no layer", pkgs: with(pk("audit", file("audit/a.go", false))),
			want: []string{`package audit is in no layer`}},
		{name: "import of a package in no layer", pkgs: with(pk("ca", file("ca/probe.go", false, "audit"))),
			want: []string{`package ca imports audit, which is in no layer`}},
		{name: "one line per file and import", pkgs: with(pk("csr", file("csr/probe.go", false, "signer", "signer"), file("csr/probe2.go", false, "signer"))),
			want: []string{"csr/probe.go:", "csr/probe2.go:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := checkLayers(mod, tt.pkgs, layers, testMayNotImport)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d violations, want %d:\n%s", len(got), len(tt.want), strings.Join(got, "\n"))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("violation %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

func TestLayerOf(t *testing.T) {
	tests := []struct{ rel, want string }{
		{"proto/istio/v1/auth", "proto"},
		{"internal/pemutil", "internal"},
		{"internal/testca", "internal/testca"},
		{"csr", "csr"},
		{"keymgr", "keymgr"},
		{"keymgr/certs", "keymgr/certs"},
		{"keymgr/dirstore", "keymgr"},
		{"keymgr/secretstore", "keymgr"},
		{"signer/local", "signer/local"},
		{"signer/k8scsr", "signer backend"},
		{"signer/k8scsr/k8scsrtest", "signertest"},
		{"signer", "signer"},
		{"signer/vault", "signer backend"},
		{"signer/signertest", "signertest"},
		{"ca", "ca"},
		{"ca/kube", "ca part"},
		{"ca/trust/publish", "ca part"},
		{"cmd/meshca", "cmd"},
		{"hack/budgets", "hack"},
		{"cause", ""},       // not "ca/..."
		{"signers", ""},     // not "signer/..."
		{"internalx", ""},   // not "internal/..."
		{"integration", ""}, // another module
	}
	for _, tt := range tests {
		got := ""
		if l := layerOf(layers, tt.rel); l != nil {
			got = l.Name
		}
		if got != tt.want {
			t.Errorf("layerOf(%q) = %q, want %q", tt.rel, got, tt.want)
		}
	}
}

func TestLayersWellFormed(t *testing.T) {
	names := map[string]bool{}
	for _, l := range layers {
		if names[l.Name] {
			t.Errorf("layer %q twice", l.Name)
		}
		names[l.Name] = true
		if l.Why == "" || len(l.Pkgs) == 0 {
			t.Errorf("layer %q needs Pkgs and Why", l.Name)
		}
	}
	for _, l := range layers {
		for _, m := range l.May {
			if !names[m] {
				t.Errorf("layer %q may import %q, which is no layer", l.Name, m)
			}
			if m == "cmd" {
				t.Errorf("layer %q may import cmd; nothing may", l.Name)
			}
		}
	}
	for _, n := range testMayNotImport {
		if !names[n] {
			t.Errorf("testMayNotImport names %q, which is no layer", n)
		}
	}
}

func TestCheckStatus(t *testing.T) {
	tests := []struct {
		name string
		pkgs []pkg
		want []string
	}{
		{name: "current tree", pkgs: current},
		{name: "ca/caclient reads codes", pkgs: with(pk("ca/caclient", file("ca/caclient/retry.go", false, statusImport)))},
		{name: "ca/kube maps errors", pkgs: with(pk("ca/kube", file("ca/kube/errors.go", false, statusImport))),
			want: []string{"grpc/status: ca/kube/errors.go: package ca/kube imports google.golang.org/grpc/status; only [ca, ca/caclient] may"}},
		{name: "keymgr", pkgs: with(pk("keymgr", file("keymgr/x.go", false, statusImport))),
			want: []string{"keymgr/x.go: package keymgr imports"}},
		{name: "a test outside ca", pkgs: with(pk("cmd/meshca", file("cmd/meshca/x_test.go", true, statusImport)))},
		{name: "generated code", pkgs: with(pk("proto/other", goFile{Path: "proto/other/x.pb.go", Generated: true, Imports: []string{statusImport}}))},
		{name: "hand-written code in proto", pkgs: with(pk("proto/other", file("proto/other/x.go", false, statusImport))),
			want: []string{"proto/other/x.go: package proto/other imports"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := checkStatus(mod, tt.pkgs, statusImporters)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d violations, want %d:\n%s", len(got), len(tt.want), strings.Join(got, "\n"))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("violation %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

func TestCheckSizes(t *testing.T) {
	tests := []struct {
		name  string
		files []sourceFile
		want  []string
	}{
		{name: "at the budget", files: []sourceFile{{Path: "a.go", Lines: 500}}},
		{name: "over it", files: []sourceFile{{Path: "a.go", Lines: 500}, {Path: "csr/b.go", Lines: 501}},
			want: []string{"size: csr/b.go has 501 lines; a Go file not marked generated may have at most 500"}},
		{name: "test files count", files: []sourceFile{{Path: "integration/e2e/x_test.go", Lines: 900}},
			want: []string{"size: integration/e2e/x_test.go has 900 lines; a Go file not marked generated may have at most 500"}},
		{name: "generated is exempt", files: []sourceFile{{Path: "proto/x.pb.go", Lines: 5000, Generated: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := checkSizes(tt.files, maxLines); !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestCheckRequires(t *testing.T) {
	allowed := map[string]string{"example.com/a": "why a"}
	if got := checkRequires([]string{"example.com/a"}, allowed); got != nil {
		t.Errorf("an allowed require: got %q, want none", got)
	}
	got := checkRequires([]string{"example.com/a", "example.com/lru"}, allowed)
	if len(got) != 1 || got[0] != "go.mod: direct require example.com/lru is not in hack/budgets' allowedRequires: add it there with its reason" {
		t.Errorf("a require not allowed: got %q", got)
	}
}

func TestIsGenerated(t *testing.T) {
	tests := []struct {
		src  string
		want bool
	}{
		{"// Code generated by protoc-gen-go. DO NOT EDIT.\n\npackage auth\n", true},
		{"// Copyright\n\n// Code generated by hand-gen. DO NOT EDIT.\r\npackage x\n", true},
		{"//go:build linux\n\n// Code generated by x. DO NOT EDIT.\npackage x\n", true},
		{"package x\n\n// Code generated by x. DO NOT EDIT.\n", false},  // after the package clause
		{"// Code generated by x. Do not edit.\npackage x\n", false},    // not the standard form
		{"//Code generated by x. DO NOT EDIT.\npackage x\n", false},     // no space
		{"// Code generated by x. DO NOT EDIT. ok\npackage x\n", false}, // trailing text
		{"// This file is not generated.\npackage x\n", false},
	}
	for _, tt := range tests {
		if got := isGenerated([]byte(tt.src)); got != tt.want {
			t.Errorf("isGenerated(%q) = %v, want %v", tt.src, got, tt.want)
		}
	}
}

func TestCountLines(t *testing.T) {
	tests := []struct {
		src  string
		want int
	}{
		{"", 0},
		{"package x\n", 1},
		{"package x", 1},
		{"package x\n\nfunc f() {}\n", 3},
		{"a\nb", 2},
	}
	for _, tt := range tests {
		if got := countLines([]byte(tt.src)); got != tt.want {
			t.Errorf("countLines(%q) = %d, want %d", tt.src, got, tt.want)
		}
	}
}
