package egress

// PublishVia is Publish with its way into the sandbox chosen: with
// helper, the socket helper (publish_rootless.go) even as root; else the
// network namespace entered per connection (root only).
func PublishVia(helper bool, pid, port int) (*Published, error) {
	var d portDialer
	if helper {
		f, err := startSocketFactory(pid)
		if err != nil {
			return nil, err
		}
		d = f
	} else {
		fd, err := openPidNetns(pid)
		if err != nil {
			return nil, err
		}
		d = netnsDialer(fd)
	}
	p, err := publishWith(d, port)
	if err != nil {
		d.close()
		return nil, err
	}
	p.ownsD = true
	return p, nil
}
