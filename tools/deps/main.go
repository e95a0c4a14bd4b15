package main
import (
 _ "github.com/google/nftables"
 _ "github.com/ti-mo/conntrack"
 _ "github.com/mdlayher/netlink"
 _ "golang.org/x/sys/unix"
 _ "github.com/vishvananda/netlink"
 _ "github.com/go-logr/logr"
 _ "sigs.k8s.io/controller-runtime"
 _ "k8s.io/client-go/kubernetes"
 _ "k8s.io/apimachinery/pkg/apis/meta/v1"
 _ "k8s.io/api/core/v1"
 _ "sigs.k8s.io/yaml"
 _ "github.com/prometheus/client_golang/prometheus"
 _ "github.com/google/go-containerregistry/pkg/v1"
)
func main(){}
