package main

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// An instruction is one Dockerfile instruction, its continuation lines joined.
type instruction struct {
	Cmd  string // upper case: FROM, RUN, ...
	Args string
}

func parseDockerfile(src string) []instruction {
	var out []instruction
	var cur strings.Builder
	for _, line := range strings.Split(src, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(s)
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args)})
		cur.Reset()
	}
	return out
}

// TestDockerfile checks that the Dockerfile, which no test here can run
// (no container daemon), makes what hack/image makes: the same build
// flags, the same root filesystem, the same user and entrypoint.
func TestDockerfile(t *testing.T) {
	src, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	all := parseDockerfile(string(src))
	last, froms := 0, 0 // the final stage starts at the last FROM
	for i, in := range all {
		if in.Cmd == "FROM" {
			last, froms = i, froms+1
		}
	}
	final := all[last:]
	find := func(ins []instruction, cmd, prefix string) (string, bool) {
		for _, in := range ins {
			if in.Cmd == cmd && strings.HasPrefix(in.Args, prefix) {
				return in.Args, true
			}
		}
		return "", false
	}
	build, _ := find(all, "RUN", "CGO_ENABLED=0")
	tests := []struct {
		name   string
		ins    []instruction
		cmd    string
		prefix string // the instruction's arguments start with this
	}{
		{"final stage from scratch", final, "FROM", "scratch"},
		{"user", final, "USER", imageUser},
		{"entrypoint", final, "ENTRYPOINT", `["/` + binaryPath + `"]`},
		{"cmd", final, "CMD", `["serve"]`},
		{"working dir", final, "WORKDIR", "/"},
		{"ports", final, "EXPOSE", "15012 15014"},
		{"rootfs copied", final, "COPY", "--from=build /rootfs/ /"},
		{"static build", all, "RUN", "CGO_ENABLED=0 GOOS=${TARGETOS}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, ok := find(tt.ins, tt.cmd, tt.prefix); !ok {
				t.Errorf("no %s %s... in the Dockerfile's %d instructions", tt.cmd, tt.prefix, len(tt.ins))
			}
		})
	}
	for _, flag := range []string{" -trimpath ", " -buildvcs=false ", ` -ldflags "` + ldflags("${VERSION}") + `" `, " ./cmd/meshca"} {
		if !strings.Contains(build, flag) {
			t.Errorf("the Dockerfile's go build %q lacks %q, which hack/image uses", build, flag)
		}
	}
	if froms != 4 {
		t.Errorf("%d stages, want four: build, build-hsm, hsm and the default image last", froms)
	}
}

// stage is the instructions of the Dockerfile's stage named name, from its
// FROM to the next.
func stage(all []instruction, name string) []instruction {
	var out []instruction
	for _, in := range all {
		if in.Cmd == "FROM" {
			if len(out) > 0 {
				break
			}
			if strings.HasSuffix(in.Args, " AS "+name) {
				out = append(out, in)
			}
			continue
		}
		if len(out) > 0 {
			out = append(out, in)
		}
	}
	return out
}

// TestDockerfileHSM checks the Dockerfile's hsm target against hack/image's
// hsm variant: the same build flags and tags, the same configuration, and
// a root filesystem of the same files: its RUN that copies the loader and
// libraries is run on the variant's binary, in a temporary directory, and
// `/meshca version` runs chrooted into the result (as root) and says
// pkcs11.
func TestDockerfileHSM(t *testing.T) {
	src, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	all := parseDockerfile(string(src))
	build, hsm := stage(all, "build-hsm"), stage(all, "hsm")
	if len(build) == 0 || len(hsm) == 0 {
		t.Fatal("the Dockerfile has no build-hsm or hsm stage")
	}
	has := func(ins []instruction, cmd, want string) string {
		for _, in := range ins {
			if in.Cmd == cmd && strings.Contains(in.Args, want) {
				return in.Args
			}
		}
		t.Errorf("no %s ...%s... in the stage", cmd, want)
		return ""
	}
	v := variants["hsm"]
	gobuild := has(build, "RUN", "go build")
	for _, flag := range []string{"CGO_ENABLED=1 ", " -trimpath ", " -buildvcs=false ", " -tags " + v.Tags + " ", ` -ldflags "` + ldflags("${VERSION}") + `" `, " ./cmd/meshca"} {
		if !strings.Contains(gobuild, flag) {
			t.Errorf("the hsm build %q lacks %q, which hack/image's hsm variant uses", gobuild, flag)
		}
	}
	has(hsm, "FROM", "scratch AS hsm")
	has(hsm, "COPY", "--from=build-hsm /rootfs/ /")
	has(hsm, "USER", imageUser)
	has(hsm, "ENTRYPOINT", `["/`+binaryPath+`"]`)
	has(hsm, "CMD", `["serve"]`)
	for _, env := range v.Env {
		has(hsm, "ENV", env)
	}
	script := has(build, "RUN", "ldd /rootfs/meshca")
	hsmFixture(t)
	root := filepath.Join(t.TempDir(), "rootfs")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(filepath.Join(hsmBuilt.root, binaryPath))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, binaryPath), bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sh", "-ec", strings.ReplaceAll(script, "/rootfs", root)).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", script, err, out)
	}
	var got, want []string
	walk := func(dir string, into *[]string) {
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && p != filepath.Join(dir, binaryPath) && !strings.HasPrefix(p, filepath.Join(dir, "etc")) {
				rel, _ := filepath.Rel(dir, p)
				*into = append(*into, rel)
			}
			return err
		})
	}
	walk(root, &got)
	walk(hsmBuilt.root, &want)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("the Dockerfile's hsm stage copies %v, hack/image's hsm layer holds %v", got, want)
	}
	if os.Geteuid() != 0 {
		t.Skip("chrooting into the stage's files needs root")
	}
	cmd := exec.Command("/"+binaryPath, "version")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir, cmd.Env = "/", []string{}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), " pkcs11") {
		t.Fatalf("/meshca version chrooted into the hsm stage's files: %v: %q, want it to end with pkcs11", err, out)
	}
}

// TestDockerfileRootfs runs the Dockerfile's RUN that writes the root
// filesystem, in a temporary directory, and compares what it made with
// hack/image's layer.
func TestDockerfileRootfs(t *testing.T) {
	src, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var script string
	for _, in := range parseDockerfile(string(src)) {
		if in.Cmd == "RUN" && strings.HasPrefix(in.Args, "mkdir -p /rootfs/etc") {
			script = in.Args
		}
	}
	if script == "" {
		t.Fatal("no RUN mkdir -p /rootfs/etc ... in the Dockerfile")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, binaryPath), []byte("binary"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-ec", strings.ReplaceAll(script, "/rootfs", root))
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", script, err, out)
	}
	for _, f := range rootfs([]byte("binary")) {
		t.Run(f.Name, func(t *testing.T) {
			fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(f.Name)))
			if err != nil {
				t.Fatal(err)
			}
			if got := tarMode(fi.Mode()); got != f.Mode {
				t.Errorf("mode %#o, want %#o as in the image's layer", got, f.Mode)
			}
			if f.Content == nil {
				if !fi.IsDir() {
					t.Errorf("not a directory")
				}
				return
			}
			got, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f.Name)))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(f.Content) {
				t.Errorf("content %q, want %q as in the image's layer", got, f.Content)
			}
		})
	}
}

// tarMode is m's permission bits and sticky bit as a tar header has them.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}
