// Package nftconn is natgw's one way to talk to nftables: every table
// name natgw owns (and the chain and map names of the tables laid out
// over it, typed ChainName and MapName) as a const, a transaction as a
// value (Tx) that renders as nft text without a kernel, a connection
// (Conn) that sends a Tx as one netlink batch in a namespace, and a Fake
// connection that keeps the table in memory and dumps it as `nft list
// table` would (knftables' Fake and Dump shape), for golden tests that
// run without root.
//
// # Layers
//
// From the bottom:
//   - Batch (batch.go): one netlink batch being encoded in one buffer.
//     Structural messages go through mdlayher/netlink's attribute encoder
//     (Msg); set elements, the bulk of a large transaction, are written
//     straight into the buffer (Elements: 15x faster than the encoder at
//     200,000 elements). Close keeps the ack flag on the last message
//     only: one answer for the whole batch, and acks cannot overrun the
//     receive buffer.
//   - Socket (socket.go): a lasting nf_tables netlink socket over
//     nat/nlsock. Commit sends a Batch in one sendmsg and reads the
//     answers up to the last message's; Classify tells a rejected batch
//     (nothing changed) from an unknown outcome (nat.ErrUnknownState).
//     Request numbers the dump requests a caller sends on it.
//   - Tx (tx.go) and Tx.Encode (encode.go): the operations of one
//     transaction, in the bytes google/nftables would send for them
//     (TestEncodeMatchesLibrary), and their nft text (String).
//   - Conn (conn.go): Netlink encodes a Tx and commits it over a Socket
//     dialed per call (reads go through google/nftables); Lasting
//     (lasting.go) keeps a Socket and google/nftables' lasting connection
//     for its life and redials after a failed commit; Fake applies a Tx in
//     memory.
//
// # Users
//
// gwimage/lbsvc (table ip natgw_lbsvc), gwimage/vpclb (tables ip and ip6
// natgw_vpclb), nat/planes (removal of the other plane's table inet/ip
// natgw), nat/gwqos (table ip natgw_gwqos, two chains; it finds its
// rules by their tags), nat/shape (table ip natgw_shape: two maps of
// classids and a chain that looks them up) write through Conn (Netlink). The main table (nat/nftables) keeps a Lasting
// for its life (a small transaction costs ~11 µs: no dial per call),
// commits its own Batches on the Lasting's Socket (its txn wraps a Batch,
// its structural messages use Batch.Msg and ChainAttrs, its elements
// Batch.Elements), dumps sets on it and reads its structure at Load over
// the Lasting's library connection.
//
// # Design: the main table on Tx (not done yet)
//
// Done: one encoder and one socket for every table. Every batch natgw
// sends is an nftconn.Batch committed by an nftconn.Socket (Classify's
// rejected/unknown split, one ack per batch, the send buffer raised for a
// large batch); set IDs come from one process counter (SetIDs); base
// chains encode and render through Chain (ChainAttrs, Header); both
// encoders are checked against google/nftables' bytes by the same
// comparison (LibraryMessages, Batch.DiffLibrary).
//
// Left: the main table still plans into its own transaction type
// (nat/nftables/tx.go: Tx, its ops and their encoding in encode.go),
// whose operations this Tx lacks (it has CreateTable and DeleteChain; the
// legacy table's delete is DeleteTable of family ip):
//   - plain sets (no data type; Map is always a map), concatenated keys
//     (NFTA_SET_DESC) and the key byte order in the set's user data
//     (nft's listing of a mark key), set flush and set delete;
//   - named limit objects (add, delete);
//   - element adds that must not find their key (create: NLM_F_EXCL) and
//     element deletes by key; the generation stamp on natgw_meta (an
//     element whose user data holds the generation);
//   - rule user data as an nft comment TLV (nft shows `comment "C"`), where
//     Rule.Tag is sent as raw bytes;
//   - elements as nft.SetElement without a text each, their text rendered
//     from the set's types only when String is called (a 100,000-FIP Sync
//     cannot afford a text per element; Element carries Text today).
//
// The plan, in green steps: (1) grow this Tx and Encode by the operations
// above, each with a case in TestEncodeMatchesLibrary; (2) move
// nat/nftables/text.go's value rendering (types to nft text) here, so
// Tx.String renders the main table's elements; (3) make nat/nftables.Tx
// a thin wrapper that fixes table inet natgw and plans into this Tx, its
// transport calling Tx.Encode and Socket.Commit as Lasting.Apply does
// (keeping the batch sized once from ElemBytes and the buffer reuse of
// small batches); (4) rewrite nat/nftables' kernel model in tests
// (tx_test.go's listing, which reads the operations) over the exported
// operations. The main table's golden dumps (testdata/golden) fix the
// text and must not change: one command per element, `comment "C"` after
// a rule. Each step passes the A/B of nat/nftables' benchmarks
// (BenchmarkFIP, BenchmarkFIPAddDelete, BenchmarkEncodeElements; branch
// ÷ main ≤ 1.1 in the medians).
package nftconn

// TableName is the name of a table natgw writes: one of the consts below,
// the one place each is spelled. Packages refer to them here (no package
// re-exports one), so a table name cannot be mistaken for a chain's or a
// set's.
type TableName string

// The tables natgw writes. natgw changes only these.
const (
	// MainTable is the data plane's table, family inet (layouts 1-3: ip),
	// laid out by nat/nftables (nat/README.md).
	MainTable TableName = "natgw"
	// GatewayQoSTable is the gateway-wide QoS table, family ip
	// (nat/gwqos).
	GatewayQoSTable TableName = "natgw_gwqos"
	// ShapeTable holds the EIP shaping maps, family ip (nat/shape).
	ShapeTable TableName = "natgw_shape"
	// LBSvcTable holds lb-svc.sh's DNAT and masquerade rules, family ip
	// (gwimage/lbsvc).
	LBSvcTable TableName = "natgw_lbsvc"
	// VPCLBTable holds the VPC LB init containers' masquerade rules,
	// families ip and ip6 (gwimage/vpclb).
	VPCLBTable TableName = "natgw_vpclb"
)

// Sets of MainTable that other packages refer to (tests that break the
// table behind the agent's back); nat/README.md has the whole layout.
const (
	MainSetFIPDNAT = "fip_dnat"
	MainSetFIPSNAT = "fip_snat"
)

// ChainName is the name of a chain of one of natgw's tables; MapName a
// map's. Each table's layout names its chains and maps in its block below,
// the one place each is spelled.
type (
	ChainName string
	MapName   string
)

// GatewayQoSTable's chains (nat/gwqos): ingress classifies before DNAT,
// egress after SNAT.
const (
	GatewayQoSIngressChain ChainName = "ingress"
	GatewayQoSEgressChain  ChainName = "egress"
)

// ShapeTable's chain and maps (nat/shape): one chain that looks a packet's
// classid up in the map of its direction.
const (
	ShapePostChain ChainName = "post"
	// ShapeIngressMap is keyed by the connection's ct mark (the EIP).
	ShapeIngressMap MapName = "ingress"
	// ShapeEgressMap is keyed by the source address.
	ShapeEgressMap MapName = "egress"
)

// LBSvcTable's chains (gwimage/lbsvc): NAT prerouting (the DNATs) and NAT
// postrouting (the masquerades).
const (
	LBSvcPreroutingChain  ChainName = "prerouting"
	LBSvcPostroutingChain ChainName = "postrouting"
)

// VPCLBTable's chain (gwimage/vpclb): NAT postrouting (the masquerades).
const VPCLBPostroutingChain ChainName = "postrouting"
