//go:build tools

// Package controller pins Kube-OVN's controller command for hack/kubeovn/build.sh.
package controller

import _ "github.com/kubeovn/kube-ovn/cmd/controller"
