package nat

import (
	"fmt"
	"strings"
)

// Names of natgw's data planes: what Dataplane.Name returns and what every
// place that chooses one takes (`natgw --dataplane` and $NATGW_DATAPLANE,
// natgw-controller's --dataplane, the gateway config's `dataplane:`, the
// VpcNatGateway annotation natgw.kubeovn.io/dataplane). The backends live in
// nat/nftables and nat/iptables; nat/planes opens them by these names.
// These consts are the one place the names are spelled: other packages
// (the backends' Name methods, controller/transport's Endpoint.Dataplane,
// the controller's flags) use them, none re-exports them.
const (
	DataplaneNftables = "nftables"
	DataplaneIptables = "iptables"
)

// DataplaneNames lists the data planes, the default (nftables) first.
var DataplaneNames = []string{DataplaneNftables, DataplaneIptables}

// CheckDataplaneName returns nil when name is one of DataplaneNames, else an
// error naming the value and the names natgw knows. It is the one check of a
// data plane name; callers wrap the error with where the name came from.
func CheckDataplaneName(name string) error {
	for _, n := range DataplaneNames {
		if name == n {
			return nil
		}
	}
	return fmt.Errorf("unknown data plane %q (want %s)", name, strings.Join(DataplaneNames, " or "))
}
