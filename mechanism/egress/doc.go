// Package egress gives a sandbox's network namespace the outside world
// under a policy: every TCP connection and every DNS query the sandbox
// makes passes through Go code in the managing process that decides
// whether it may leave.
//
//	p, err := egress.Attach(initPid, nil, egress.Config{}) // every public destination
//	pol, err := egress.ParsePolicy([]string{"api.example.com", "*.example.org", "203.0.113.0/24:443"})
//	p.SetPolicy(pol) // in force for new connections now; open ones it denies are cut
//
// The jail uses it as root and without root (see Rootless below), and
// mechanism/oci for runc and for gVisor's runsc, whose sandbox then runs
// with gVisor's host network in the container's own namespace, so that
// the sentry's sockets are the kernel's there and meet the same packet
// filter (gVisor's own stack keeps its packets to itself; see
// mechanism/oci's network.go for what that costs).
//
// # How
//
// The sandbox's namespace keeps lo as its only interface, gets a default
// IPv4 route through it (and no IPv6 route but ::1), and one nftables NAT
// chain on its output hook (installed over netlink by
// github.com/google/nftables) that the workload cannot change (it has no
// CAP_NET_ADMIN, and seccomp refuses new namespaces):
//
//   - to 127.0.0.0/8, the sandbox's own loopback: untouched;
//   - UDP: redirected to a closed port of that loopback (port
//     unreachable), so the only UDP that is answered is the sandbox's
//     resolver's, 127.0.0.53:53, a socket of this process made in the
//     sandbox's namespace, which forwards allowed queries to the upstream
//     resolvers (github.com/miekg/dns) and remembers which addresses each
//     name resolved to for this sandbox (AAAA is answered empty);
//   - TCP to a forbidden destination: redirected to the closed port,
//     so refused at connect: this host's own addresses, loopback,
//     link-local with the metadata address 169.254.169.254, multicast and
//     reserved ranges, and the private ranges (10/8, 100.64/10,
//     172.16/12, 192.168/16, 198.18/15) unless Config.AllowPrivate;
//   - with a policy, TCP to an address that neither a CIDR entry nor an
//     allowed name the sandbox resolved can allow: the same;
//   - every other TCP connection: redirected to a port on the sandbox's
//     loopback where this process listens (a socket made in the
//     sandbox's namespace); the proxy reads the original destination
//     (SO_ORIGINAL_DST), checks it again, applies the policy, dials from
//     the host's namespace (or through Config.Dial), and relays (splice(2)
//     between the two sockets).
//
// Nothing else has anywhere to go: a packet no rule redirects loops back
// through lo and is dropped, as the namespace forwards nothing. Other
// sandboxes are not reachable: they have no address but their own
// loopback, and what they publish is on the host's loopback, for their
// owner only (below).
// A sandbox whose proxy is gone (the process serving it died) fails
// closed: its connections are refused and its queries go unanswered.
//
// This is a userspace proxy rather than NAT and forwarding because the
// policy is about names, which only the resolver and the connection's
// first bytes carry; and rather than a userspace TCP/IP stack on a TUN
// device (gVisor's netstack is not served to this project) because the
// kernel's own TCP in the sandbox's namespace and splice between two
// kernel sockets cost less than parsing every packet in Go.
//
// # Rootless
//
// A manager that is not root (a rootless jail: the sandbox's namespaces
// belong to a user namespace this user made) gets the same egress from
// the same Attach. It cannot enter the namespace itself: setns(2) into a
// user namespace refuses a multithreaded process, so every Go process.
// util-linux's nsenter (a single-threaded C program, Essential in
// Debian) joins the sandbox's user and network namespaces and executes
// this binary there, as root of that user namespace (which owns the
// network namespace); it sets the namespace up as the root path does
// (lo, the route, the packet filter, the proxy's and the resolver's
// sockets), hands the sockets to the manager over a socket pair
// (SCM_RIGHTS) and exits: this package's init takes that role before
// main runs, so no program needs to call anything. The manager serves
// the sockets and dials out from its own network namespace as its own
// user. What differs from root: nobody stays in the namespace to change
// its packet filter, so it is always the one without a policy (every
// TCP connection to the proxy, the forbidden destinations refused at
// connect) and a policy is enforced by the proxy alone, with the same
// checks: a connection it does not allow is accepted and reset at once,
// before a byte leaves, rather than refused at connect. Publish and
// PublishPorts, which as root enter the namespace for each connection,
// use a second helper nsenter starts there: it stays, makes an
// unconnected TCP socket of the namespace on each request and hands it
// over (a socket keeps the namespace it was made in), and the manager
// connects it to the sandbox's 127.0.0.1:PORT itself; the helper serves
// one request at a time and exits when the manager closes the ports (or
// dies) or when the sandbox's init exits; one killed while the sandbox
// runs is started again (publish_rootless.go).
// RootlessSupported says whether nsenter is there.
//
// # Published ports
//
// Publish and PublishPorts make a port of a sandbox's loopback reachable
// from this host, and only to the user that published it (and root):
// each published port is a unix socket, mode 0600 in PortsDir (a
// directory of that user's, 0700, that must not be reachable by anyone
// else or no socket is made there), which another user's connect(2)
// fails on with EACCES: what `managoat serve` proxies behind its API
// keys (SocketFor finds it from the address below); and a TCP port of
// 127.0.0.1 for the user's own browser and tools (`managoat url`), where
// a connection is relayed only when the kernel's socket diagnostics
// (sock_diag, asked for that one socket) say the socket at
// its other end is owned by that user or by root: any other user's is
// reset before a byte is read from it or anything is dialled inside the
// sandbox. (A user is the unit: every process of that user, and root,
// can reach the ports it publishes, as they can read its files.)
//
// # The guarantee of a policy
//
// With no policy (nil) every public destination is reachable. With an
// allow list (ParsePolicy; `[]` allows nothing), a TCP connection to
// addr:port leaves the host only when
//
//   - a CIDR or address entry contains addr (and its port, if it names
//     one, is port), or
//   - a domain entry allows the name N that the connection presents (the
//     TLS ClientHello's SNI, or the HTTP request's Host, read before
//     anything is sent on) on port, AND the sandbox resolved N to addr
//     through its own resolver (127.0.0.53) earlier.
//
// So a raw IP of a denied host is refused (nothing resolved an allowed
// name to it), so is an allowed name forged into the SNI or Host of a
// connection to another address, and so is DNS to any other resolver
// (UDP there is rejected; TCP there is an ordinary connection the list
// must allow). A domain entry is exact ("example.com") or a wildcard
// ("*.example.com": every subdomain, not example.com itself), on any port
// or on one ("example.com:443"). A name the list does not allow is
// answered REFUSED, with an Extended DNS Error 18 "Prohibited" (RFC
// 8914) whose text says the sandbox's egress policy does not allow it,
// to a query with EDNS (dig shows it; glibc shows any REFUSED as
// "Temporary failure in name resolution"). Each refusal (that lookup, a
// connection reset, a request answered 403) is a Refusal: the proxy
// keeps the latest 32 (Proxy.Refusals) and tells Config.OnRefusal, at
// most 10 a second (provider/local writes them to the sandbox's
// supervisor log, and `managoat policy NAME` shows the latest). A connection that only a domain entry could allow
// and that presents no name (neither TLS nor HTTP, or a client that waits
// for the server to speak first) is refused after Config.PeekTimeout.
// A plain HTTP connection allowed by a name is checked request by
// request (httpflow.go): every request on it, kept alive or pipelined,
// must name that host (its Host, or its absolute URI's), and is written
// on anew from what the proxy parsed, so no second request rides in a
// body framed two ways; a CONNECT tunnel must carry TLS whose ClientHello
// names the CONNECT host (SNI), a TLS connection or tunnel without SNI
// is refused, an h2c upgrade is dropped from the request, and a
// WebSocket is relayed raw once the server switched. A plain HTTP
// request refused by name is answered 403 with X-Managoat-Egress:
// refused and a body that says the sandbox's egress policy refused it
// (the requests before it on the connection are answered first). What
// cannot be inspected is inside TLS: the Host of the requests in a TLS
// connection (or an HTTP/2 one's streams, or the inner SNI of an
// Encrypted Client Hello, whose outer SNI is what is checked) may name
// another host the same server serves (domain fronting; the hosted providers' SNI and Host
// checks have the same bound). IPv6 egress is not provided.
// SetPolicy (or Apply, from another process) puts a new list in force
// for the next connection and cuts, before it returns, every open
// connection the new list would not allow. Whatever the list, the
// forbidden destinations above stay forbidden.
//
// Beside the hosted providers: E2B documents domain filtering for HTTP on
// port 80 (Host) and TLS on 443 (SNI) only, other ports falling back to
// CIDR rules, that a blocked TCP connection may look accepted from inside,
// and that its default resolver 8.8.8.8 is allowed whenever a domain is;
// here any port is filtered by name, a destination no entry can allow is
// reset at connect (rootless: at once after it, before a byte leaves),
// and no outside resolver is ever allowed implicitly.
// Sprites documents DNS-based filtering by exact and wildcard domains,
// changes that apply at once and terminate existing connections to newly
// blocked domains, and REFUSED for denied lookups; here the same, and a
// connection must also present an allowed name to an address its own
// resolver gave for that name.
//
// # Limits
//
// A policy has at most MaxEntries entries; the resolver remembers at most
// 65536 name/address pairs per sandbox; a sandbox opens at most
// Config.ConnRate new connections a second (default 256, bursts of twice
// that) and has at most Config.MaxConns (default 1024) open at once, past
// which a new one is reset, and its resolver answers at most 64 UDP
// queries at once, dropping the rest. Each sandbox has its own listening sockets
// and goroutines, so one that floods them does not starve another's.
package egress
