//go:build natgw_omit_ha

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// HABinary is the name of the binary that runs `natgw ha` when natgw is
// built without it (the build tag natgw_omit_ha, as the gateway image's
// /natgw is): the same main package built without the tag, which links what
// a replica needs and a gateway's other commands do not (client-go's REST
// client and API machinery for the fencing Lease and the sibling Pod,
// Prometheus for the replica's metrics). Every pod execs natgw, often once
// per rule (nat-gateway.sh through Kube-OVN's controller) or once per
// session (natgw serve); a replica runs once per pod. Leaving these out of
// natgw halves its size and what each exec maps and starts (gwimage/README,
// "Image"; bench/results/lean-ab, s6gw-1000x20-lean).
//
// imagebuild.HABinary names the same file in the image (this binary cannot
// import the image builder); imagebuild.TestImage runs `natgw ha` in the
// image's layout, so the two cannot drift apart unnoticed.
const HABinary = "natgw-ha"

// cmdHA is `natgw ha` in a natgw built without it: it execs HABinary from
// natgw's own directory (the image's /natgw-ha) with the same command line,
// so the replica keeps the PID, the streams and the signals of the command
// the pod started (`/natgw ha ...`, controller/provision).
func cmdHA(_ context.Context, e env, _ *globals, _ []string) int {
	path, err := haBinary()
	if err != nil {
		fmt.Fprintf(e.stderr, "natgw ha: this natgw is built without ha (natgw_omit_ha) and %v\n", err)
		return exitFail
	}
	argv := append([]string{path}, e.argv[1:]...)
	err = syscall.Exec(path, argv, os.Environ())
	fmt.Fprintf(e.stderr, "natgw ha: exec %s: %v\n", path, err)
	return exitFail
}

// haBinary finds HABinary beside the running executable, else on PATH.
func haBinary() (string, error) {
	self, err := os.Executable()
	if err == nil {
		p := filepath.Join(filepath.Dir(self), HABinary)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath(HABinary)
	if err != nil {
		return "", fmt.Errorf("%s is neither beside %s nor on PATH: %w", HABinary, self, err)
	}
	return p, nil
}
