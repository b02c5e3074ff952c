package load

import (
	"fmt"
	"os/exec"
	"runtime"
)

// Pin restricts every thread of each process (by pid) to the CPUs given
// for it ("0", "1-3"), with taskset, and returns a func that lets them
// all run on every CPU again. It models processes that run on machines
// of their own, as meshca and Vault do when deployed, on the cores of one.
func Pin(cpus map[int]string) (func(), error) {
	if _, err := exec.LookPath("taskset"); err != nil {
		return nil, fmt.Errorf("load: taskset (util-linux) is needed to pin processes: %w", err)
	}
	all := fmt.Sprintf("0-%d", runtime.NumCPU()-1)
	unpin := func() {
		for pid := range cpus {
			_ = taskset(pid, all)
		}
	}
	for pid, c := range cpus {
		if err := taskset(pid, c); err != nil {
			unpin()
			return nil, err
		}
	}
	return unpin, nil
}

func taskset(pid int, cpus string) error {
	out, err := exec.Command("taskset", "-a", "-p", "-c", cpus, fmt.Sprint(pid)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("load: taskset -a -p -c %s %d: %v: %s", cpus, pid, err, out)
	}
	return nil
}
