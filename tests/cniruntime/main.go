// Command linkerd-cni-runtime is a minimal container runtime for the end-to-end tests and the
// demo: it runs a CNI network configuration list through libcni (ADD, CHECK, DEL) exactly as
// containerd's CRI plugin does, with the result cache, prevResult hand-over and capability
// arguments, against network namespaces made by the caller.
//
// Usage:
//
//	linkerd-cni-runtime -conflist F -path DIR[:DIR...] -cache-dir D -container-id ID \
//	    [-netns PATH] [-ifname eth0] [-arg K=V ...] [-cgroup-path P] add|check|del
//
// The -arg pairs become CNI_ARGS, shuffled on every call (containerd passes them in map order,
// i.e. in random order). -cgroup-path is offered as the "cgroupPath" capability argument; libcni
// hands it to the plugins that declare that capability, as runtimeConfig.cgroupPath.
//
// On success ADD prints the chain's result on stdout; CHECK and DEL print nothing. On failure
// it prints the plugin's CNI error object ({"code","msg","details"}) on stdout, plus "context"
// (libcni's account of which plugin failed), and exits 1; when the failure is not a plugin's
// error (an unreadable conflist, say) the code is 999 and it exits 2.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

type argList []string

func (a *argList) String() string     { return strings.Join(*a, ";") }
func (a *argList) Set(v string) error { *a = append(*a, v); return nil }

// failure is what is printed on stdout when the operation fails: the plugin's CNI error, plus
// libcni's description of where in the chain it happened.
type failure struct {
	Code    uint   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details,omitempty"`
	Context string `json:"context"`
}

func fail(err error) {
	out := failure{Code: 999, Msg: err.Error(), Context: err.Error()}
	exit := 2
	var cniErr *types.Error
	if errors.As(err, &cniErr) {
		out = failure{Code: cniErr.Code, Msg: cniErr.Msg, Details: cniErr.Details, Context: err.Error()}
		exit = 1
	}
	body, _ := json.Marshal(out)
	fmt.Println(string(body))
	os.Exit(exit)
}

func main() {
	conflist := flag.String("conflist", "", "network configuration list file")
	path := flag.String("path", "", "plugin directories, colon-separated")
	cacheDir := flag.String("cache-dir", "", "libcni result cache directory")
	containerID := flag.String("container-id", "", "CNI_CONTAINERID")
	netns := flag.String("netns", "", "CNI_NETNS (may be empty for del)")
	ifname := flag.String("ifname", "eth0", "CNI_IFNAME")
	cgroupPath := flag.String("cgroup-path", "", "cgroupPath capability argument")
	timeout := flag.Duration("timeout", 60*time.Second, "deadline for the whole operation")
	var args argList
	flag.Var(&args, "arg", "CNI_ARGS pair K=V (repeatable)")
	flag.Parse()
	if flag.NArg() != 1 || *conflist == "" || *path == "" || *cacheDir == "" || *containerID == "" {
		fmt.Fprintln(os.Stderr, "usage: linkerd-cni-runtime -conflist F -path DIRS -cache-dir D -container-id ID [-netns P] [-ifname I] [-arg K=V]... [-cgroup-path P] add|check|del")
		os.Exit(2)
	}

	list, err := libcni.ConfListFromFile(*conflist)
	if err != nil {
		fail(err)
	}
	rt := &libcni.RuntimeConf{
		ContainerID:    *containerID,
		NetNS:          *netns,
		IfName:         *ifname,
		CapabilityArgs: map[string]interface{}{},
	}
	rand.Seed(time.Now().UnixNano())
	rand.Shuffle(len(args), func(i, j int) { args[i], args[j] = args[j], args[i] })
	for _, kv := range args {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			fail(fmt.Errorf("-arg %q is not K=V", kv))
		}
		rt.Args = append(rt.Args, [2]string{k, v})
	}
	if *cgroupPath != "" {
		rt.CapabilityArgs["cgroupPath"] = *cgroupPath
	}
	cni := libcni.NewCNIConfigWithCacheDir(strings.Split(*path, ":"), *cacheDir, nil)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	switch flag.Arg(0) {
	case "add":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			fail(err)
		}
		if err := result.PrintTo(os.Stdout); err != nil {
			fail(err)
		}
	case "check":
		if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
			fail(err)
		}
	case "del":
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			fail(err)
		}
	default:
		fail(fmt.Errorf("unknown verb %q (add, check, del)", flag.Arg(0)))
	}
}
