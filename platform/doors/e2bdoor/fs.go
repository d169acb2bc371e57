package e2bdoor

import (
	"context"
	"errors"
	"path"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/managoat/managoat/sandbox"
)

// The filesystem.Filesystem calls the door serves (Stat, MakeDir, Move,
// Remove) run as one short shell command each in the sandbox, through
// /v1's exec: the platform has no such operations of its own. Exit 44 is
// "no such path", 45 "already exists".
const statLine = `stat -L -c '%F|%s|%a|%U|%G|%Y' -- "$1" && realpath -m -- "$1"`

var fsScripts = map[string]string{
	"Stat":    `[ -e "$1" ] || exit 44; ` + statLine,
	"MakeDir": `[ -e "$1" ] && exit 45; mkdir -p -- "$1" || exit 1; ` + statLine,
	"Move":    `[ -e "$1" ] || exit 44; mkdir -p -- "$(dirname -- "$2")" && mv -- "$1" "$2" && set -- "$2" && ` + statLine,
	"Remove":  `rm -rf -- "$1"`,
}

type pathReq struct {
	Path        string `json:"path"`
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

type entryInfo struct {
	Name         string `json:"name"`
	Type         string `json:"type"`
	Path         string `json:"path"`
	Size         string `json:"size,omitempty"`
	Mode         uint32 `json:"mode,omitempty"`
	Permissions  string `json:"permissions,omitempty"`
	Owner        string `json:"owner,omitempty"`
	Group        string `json:"group,omitempty"`
	ModifiedTime string `json:"modifiedTime,omitempty"`
}

type entryResp struct {
	Entry *entryInfo `json:"entry,omitempty"`
}

func (d *Door) fsCall(op string) func(context.Context, *connect.Request[pathReq]) (*connect.Response[entryResp], error) {
	return func(ctx context.Context, req *connect.Request[pathReq]) (*connect.Response[entryResp], error) {
		c := callOf(ctx)
		args := []string{"-c", fsScripts[op], "sh", req.Msg.Path}
		if op == "Move" {
			args = []string{"-c", fsScripts[op], "sh", req.Msg.Source, req.Msg.Destination}
		}
		if args[3] == "" {
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("path is required"))
		}
		r, err := c.p.Exec(ctx, c.h, sandbox.Cmd{Name: "/bin/sh", Args: args}, sandbox.ExecOptions{MaxOutput: 8 << 10, Timeout: time.Minute})
		if err != nil {
			return nil, rpcErr(err)
		}
		switch r.ExitCode {
		case 0:
		case 44:
			return nil, connect.NewError(connect.CodeNotFound, errors.New("path '"+args[3]+"' does not exist"))
		case 45:
			return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("path '"+args[3]+"' already exists"))
		default:
			return nil, connect.NewError(connect.CodeInternal, errors.New(op+" failed: "+strings.TrimSpace(string(r.Output))))
		}
		if op == "Remove" {
			return connect.NewResponse(&entryResp{}), nil
		}
		lines := strings.Split(strings.TrimSpace(string(r.Output)), "\n")
		f := strings.Split(lines[0], "|")
		if len(lines) < 2 || len(f) != 6 {
			return nil, connect.NewError(connect.CodeInternal, errors.New("malformed stat output"))
		}
		e := &entryInfo{Name: path.Base(lines[1]), Path: lines[1], Size: f[1], Owner: f[3], Group: f[4], Type: "FILE_TYPE_FILE"}
		if f[0] == "directory" {
			e.Type = "FILE_TYPE_DIRECTORY"
		}
		if m, err := strconv.ParseUint(f[2], 8, 32); err == nil {
			e.Mode = uint32(m)
		}
		if s, err := strconv.ParseInt(f[5], 10, 64); err == nil {
			e.ModifiedTime = time.Unix(s, 0).UTC().Format(time.RFC3339)
		}
		return connect.NewResponse(&entryResp{Entry: e}), nil
	}
}

type listDirReq struct {
	Path  string `json:"path"`
	Depth uint32 `json:"depth,omitempty"`
}

type listDirResp struct {
	Entries []entryInfo `json:"entries,omitempty"`
}

// listDir is filesystem.Filesystem/ListDir: find(1) in the sandbox to the
// depth asked (1 when none), its output bounded (a listing past it is
// resource_exhausted, never a partial one that looks whole).
func (d *Door) listDir(ctx context.Context, req *connect.Request[listDirReq]) (*connect.Response[listDirResp], error) {
	c := callOf(ctx)
	if req.Msg.Path == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("path is required"))
	}
	depth := max(req.Msg.Depth, 1)
	script := `[ -d "$1" ] || exit 44; cd -- "$1" && find "$(pwd -P)" -mindepth 1 -maxdepth "$2" -printf '%y|%s|%m|%u|%g|%T@|%p\n'`
	r, err := c.p.Exec(ctx, c.h, sandbox.Cmd{Name: "/bin/sh", Args: []string{"-c", script, "sh", req.Msg.Path, strconv.Itoa(int(min(depth, 64)))}},
		sandbox.ExecOptions{MaxOutput: 4 << 20, Timeout: time.Minute})
	if err != nil {
		return nil, rpcErr(err)
	}
	switch {
	case r.ExitCode == 44:
		return nil, connect.NewError(connect.CodeNotFound, errors.New("directory '"+req.Msg.Path+"' does not exist"))
	case r.Truncated:
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("the listing is over 4 MiB"))
	case r.ExitCode != 0:
		return nil, connect.NewError(connect.CodeInternal, errors.New("ListDir failed: "+strings.TrimSpace(string(r.Output))))
	}
	out := &listDirResp{}
	for _, line := range strings.Split(strings.TrimSpace(string(r.Output)), "\n") {
		f := strings.SplitN(line, "|", 7)
		if len(f) != 7 {
			continue
		}
		e := entryInfo{Name: path.Base(f[6]), Path: f[6], Size: f[1], Owner: f[3], Group: f[4], Type: "FILE_TYPE_FILE"}
		if f[0] == "d" {
			e.Type = "FILE_TYPE_DIRECTORY"
		}
		if m, err := strconv.ParseUint(f[2], 8, 32); err == nil {
			e.Mode = uint32(m)
		}
		if s, err := strconv.ParseFloat(f[5], 64); err == nil {
			e.ModifiedTime = time.Unix(int64(s), 0).UTC().Format(time.RFC3339)
		}
		out.Entries = append(out.Entries, e)
	}
	return connect.NewResponse(out), nil
}
