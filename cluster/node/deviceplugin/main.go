// Command neuron-device-plugin-standin is a stand-in for the AWS Neuron device plugin,
// for the local cluster's real node. It speaks the kubelet's real device-plugin API
// (v1beta1, over the kubelet's socket) and advertises the two resources the AWS plugin
// does, aws.amazon.com/neuron (devices) and aws.amazon.com/neuroncore (cores):
// https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/kubernetes-getting-started.html
//
// On Allocate it does what the AWS plugin and scheduler extension document
// (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/k8s-neuron-scheduler-flow.html):
// the container gets the granted /dev/neuronN devices and NEURON_RT_VISIBLE_CORES set to
// those devices' absolute core ids (a pod granted /dev/neuron1 on a 2-core chip sees 2,3).
//
// With --efa N it also advertises vpc.amazonaws.com/efa, as AWS's EFA device plugin does on
// instances with Elastic Fabric Adapters (https://docs.aws.amazon.com/eks/latest/userguide/node-efa.html):
// a container granted EFA devices gets their /dev/infiniband/uverbsN files.
//
// The device files are stand-ins made by the local cluster (character devices with
// /dev/null's numbers). The plugin prefers the highest-numbered free devices, so a pod
// that assumes it got cores 0-1 fails here as it would on a real instance.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// standinLockPath is where the runtime stand-in finds the node's core locks.
const standinLockPath = "/run/neuron-standin"

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	lockDir      string
	resource     string
	socket       string
	devDir       string
	chips        int
	coresPerChip int
	platform     string // the instance family, for the runtime stand-in (NEURON_STANDIN_PLATFORM)
	perCore      bool   // aws.amazon.com/neuroncore: one device id per core
	efa          int    // vpc.amazonaws.com/efa: this many EFA devices, and no Neuron device
}

func (p *plugin) ids() []string {
	n := p.chips
	if p.efa > 0 {
		n = p.efa
	} else if p.perCore {
		n = p.chips * p.coresPerChip
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	return ids
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	var devs []*pluginapi.Device
	for _, id := range p.ids() {
		devs = append(devs, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

// GetPreferredAllocation prefers the highest ids: a pod is granted the last chips first.
func (p *plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range req.ContainerRequests {
		avail := append([]string(nil), c.AvailableDeviceIDs...)
		sort.Slice(avail, func(i, j int) bool { return atoi(avail[i]) > atoi(avail[j]) })
		chosen := append([]string(nil), c.MustIncludeDeviceIDs...)
		for _, id := range avail {
			if len(chosen) >= int(c.AllocationSize) {
				break
			}
			if !contains(chosen, id) {
				chosen = append(chosen, id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: chosen})
	}
	return resp, nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	if p.efa > 0 {
		for _, c := range req.ContainerRequests {
			var devices []*pluginapi.DeviceSpec
			for _, id := range c.DevicesIds {
				path := "/dev/infiniband/uverbs" + id
				devices = append(devices, &pluginapi.DeviceSpec{
					ContainerPath: path, HostPath: filepath.Join(p.devDir, "infiniband", filepath.Base(path)), Permissions: "rw",
				})
			}
			log.Printf("%s: allocate %v", p.resource, c.DevicesIds)
			resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{Devices: devices})
		}
		return resp, nil
	}
	for _, c := range req.ContainerRequests {
		var cores []int
		chips := map[int]bool{}
		for _, id := range c.DevicesIds {
			n := atoi(id)
			if p.perCore {
				cores = append(cores, n)
				chips[n/p.coresPerChip] = true
			} else {
				chips[n] = true
				for k := 0; k < p.coresPerChip; k++ {
					cores = append(cores, n*p.coresPerChip+k)
				}
			}
		}
		sort.Ints(cores)
		var devices []*pluginapi.DeviceSpec
		var chipIDs []int
		for chip := range chips {
			chipIDs = append(chipIDs, chip)
		}
		sort.Ints(chipIDs)
		for _, chip := range chipIDs {
			path := fmt.Sprintf("/dev/neuron%d", chip)
			devices = append(devices, &pluginapi.DeviceSpec{
				ContainerPath: path, HostPath: filepath.Join(p.devDir, filepath.Base(path)), Permissions: "rw",
			})
		}
		var list []string
		for _, c := range cores {
			list = append(list, strconv.Itoa(c))
		}
		log.Printf("%s: allocate %v -> devices %v, NEURON_RT_VISIBLE_CORES=%s", p.resource, c.DevicesIds, chipIDs, strings.Join(list, ","))
		var mounts []*pluginapi.Mount
		if p.lockDir != "" {
			// The runtime stand-in's record of which live process holds which core, shared by
			// every container on the node as the driver's state is: the real runtime takes its
			// cores exclusively, and a second process asking for a held core fails with
			// "NeuronCore(s) not available" (the torch-neuronx troubleshooting guide). Nothing
			// the operator runs reads it.
			mounts = append(mounts, &pluginapi.Mount{ContainerPath: standinLockPath, HostPath: p.lockDir})
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			// NEURON_STANDIN_CORES_PER_DEVICE and NEURON_STANDIN_PLATFORM are for the runtime
			// stand-in only (the real runtime asks the driver how many cores a device has, and the
			// vLLM Neuron plugin detects the platform from the hardware); nothing the operator runs reads them.
			Envs: map[string]string{
				"NEURON_RT_VISIBLE_CORES":         strings.Join(list, ","),
				"NEURON_STANDIN_CORES_PER_DEVICE": strconv.Itoa(p.coresPerChip),
				"NEURON_STANDIN_PLATFORM":         p.platform,
			},
			Devices: devices,
			Mounts:  mounts,
		})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// serve listens on the plugin's socket and registers with the kubelet.
func (p *plugin) serve(pluginDir string) (*grpc.Server, error) {
	_ = os.Remove(p.socket)
	lis, err := net.Listen("unix", p.socket)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(lis) }()

	conn, err := grpc.NewClient("unix://"+filepath.Join(pluginDir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.resource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	return srv, err
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func main() {
	pluginDir := flag.String("plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory")
	devDir := flag.String("dev-dir", "/dev", "where the /dev/neuronN device files are on the host")
	chips := flag.Int("chips", 1, "Neuron devices on this node")
	coresPerChip := flag.Int("cores-per-chip", 2, "NeuronCores per device, as the device plugin counts them")
	lockDir := flag.String("lock-dir", "", "a host directory for the runtime stand-in's core locks, mounted into every container granted Neuron devices")
	platform := flag.String("platform", "inf2", "the instance family (inf1, inf2, trn1, trn2, trn3), as the hardware would tell the runtime")
	efa := flag.Int("efa", 0, "EFA devices on this node (vpc.amazonaws.com/efa), as AWS's EFA device plugin advertises them; 0 for none")
	flag.Parse()

	plugins := []*plugin{
		{resource: "aws.amazon.com/neuron", socket: filepath.Join(*pluginDir, "neuron-standin.sock")},
		{resource: "aws.amazon.com/neuroncore", socket: filepath.Join(*pluginDir, "neuroncore-standin.sock"), perCore: true},
	}
	if *efa > 0 {
		plugins = append(plugins, &plugin{resource: "vpc.amazonaws.com/efa", socket: filepath.Join(*pluginDir, "efa-standin.sock"), efa: *efa})
	}
	kubeletSock := filepath.Join(*pluginDir, "kubelet.sock")
	var lastKubelet time.Time
	var servers []*grpc.Server
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		// (Re-)register whenever the kubelet's socket is (re)created, as device plugins must.
		if st, err := os.Stat(kubeletSock); err == nil && st.ModTime() != lastKubelet {
			for _, s := range servers {
				s.Stop()
			}
			servers = nil
			ok := true
			for _, p := range plugins {
				p.devDir, p.chips, p.coresPerChip, p.lockDir, p.platform = *devDir, *chips, *coresPerChip, *lockDir, *platform
				s, err := p.serve(*pluginDir)
				if err != nil {
					log.Printf("register %s: %v", p.resource, err)
					ok = false
					if s != nil {
						s.Stop()
					}
					continue
				}
				servers = append(servers, s)
				log.Printf("registered %s: %d devices", p.resource, len(p.ids()))
			}
			if ok {
				lastKubelet = st.ModTime()
			}
		}
		select {
		case <-stop:
			for _, s := range servers {
				s.Stop()
			}
			return
		case <-tick.C:
		}
	}
}
