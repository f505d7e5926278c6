// Command neuron-dra-standin is a stand-in for AWS's Neuron DRA driver (neuron.aws.com), for
// the local cluster's real node when it runs in DRA mode. It is a kubelet DRA plugin built on
// the kubelet plugin helper of k8s.io/dynamic-resource-allocation at the cluster's release,
// and does what the Neuron DRA page documents
// (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/neuron-dra.html):
//
//   - it publishes the node's Neuron devices in a ResourceSlice of the driver neuron.aws.com,
//     one device each (neurondevice<N>), with the driver's attributes: deviceId,
//     instanceType, neuronDriverVersion, resourceType (neuron_device), and on Trainium's grid
//     the connected-device groups resource.aws.com/devicegroup{1,4,8,16}_id;
//   - on NodePrepareResources it reads the claim's allocation and its NeuronConfig
//     (logicalNeuronCore), and hands the container, through a CDI spec that containerd
//     applies, the granted /dev/neuron<N> devices, NEURON_RT_VISIBLE_CORES set to those
//     devices' logical cores at that LNC, and NEURON_LOGICAL_NC_CONFIG;
//   - on NodeUnprepareResources it removes that CDI spec.
//
// The device files are the local cluster's stand-ins (character devices with /dev/null's
// numbers). NEURON_STANDIN_* variables and the core-lock mount are for the runtime stand-in
// only, as with the device-plugin stand-in; nothing the operator runs reads them.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

const (
	driverName      = "neuron.aws.com"
	groupAttribute  = "resource.aws.com/devicegroup%d_id"
	standinLockPath = "/run/neuron-standin"
	cdiKind         = driverName + "/claim"
)

type driver struct {
	devDir, lockDir, cdiDir, instanceType, platform string
	chips, physicalCores, defaultLNC              int
	grid                                          bool
}

// devices are the node's Neuron devices as the driver publishes them.
func (d *driver) devices() []resourceapi.Device {
	out := make([]resourceapi.Device, 0, d.chips)
	for i := 0; i < d.chips; i++ {
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"deviceId":            {IntValue: ptr.To(int64(i))},
			"instanceType":        {StringValue: ptr.To(d.instanceType)},
			"neuronDriverVersion": {StringValue: ptr.To("2.25.4.0")},
			"resourceType":        {StringValue: ptr.To("neuron_device")},
		}
		if d.grid {
			// Trainium's grid: rows of 4 connected devices, two rows of 8, the whole 16.
			for _, size := range []int{1, 4, 8, 16} {
				attrs[resourceapi.QualifiedName(fmt.Sprintf(groupAttribute, size))] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(i / size))}
			}
		}
		out = append(out, resourceapi.Device{Name: fmt.Sprintf("neurondevice%d", i), Attributes: attrs})
	}
	return out
}

// neuronConfig is the opaque configuration AWS's claim templates pass (kind NeuronConfig).
type neuronConfig struct {
	Kind              string `json:"kind"`
	LogicalNeuronCore int    `json:"logicalNeuronCore"`
}

func (d *driver) lncOf(claim *resourceapi.ResourceClaim) (int, error) {
	lnc := d.defaultLNC
	for _, c := range claim.Status.Allocation.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != driverName {
			continue
		}
		var cfg neuronConfig
		if err := json.Unmarshal(c.Opaque.Parameters.Raw, &cfg); err != nil {
			return 0, fmt.Errorf("claim %s: opaque parameters are not a NeuronConfig: %w", claim.Name, err)
		}
		if cfg.Kind == "NeuronConfig" && cfg.LogicalNeuronCore != 0 {
			lnc = cfg.LogicalNeuronCore
		}
	}
	if lnc != 1 && lnc != 2 || d.physicalCores%lnc != 0 || (lnc == 2 && d.defaultLNC != 2) {
		return 0, fmt.Errorf("claim %s: logicalNeuronCore %d is not supported on %s", claim.Name, lnc, d.instanceType)
	}
	return lnc, nil
}

func (d *driver) prepare(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if claim.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s is not allocated", claim.Name)}
	}
	lnc, err := d.lncOf(claim)
	if err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	perDevice := d.physicalCores / lnc
	cdiID := cdiKind + "=" + string(claim.UID)
	var result kubeletplugin.PrepareResult
	var ids []int
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != driverName {
			continue
		}
		id, err := strconv.Atoi(strings.TrimPrefix(r.Device, "neurondevice"))
		if err != nil || id < 0 || id >= d.chips {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s: unknown device %q", claim.Name, r.Device)}
		}
		ids = append(ids, id)
		result.Devices = append(result.Devices, kubeletplugin.Device{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, CDIDeviceIDs: []string{cdiID},
		})
	}
	sort.Ints(ids)
	var cores []string
	var nodes []map[string]string
	for _, id := range ids {
		for k := 0; k < perDevice; k++ {
			cores = append(cores, strconv.Itoa(id*perDevice+k))
		}
		path := fmt.Sprintf("/dev/neuron%d", id)
		nodes = append(nodes, map[string]string{"path": path, "hostPath": filepath.Join(d.devDir, filepath.Base(path)), "permissions": "rw"})
	}
	edits := map[string]any{
		"env": []string{
			"NEURON_RT_VISIBLE_CORES=" + strings.Join(cores, ","),
			"NEURON_LOGICAL_NC_CONFIG=" + strconv.Itoa(lnc),
			"NEURON_STANDIN_CORES_PER_DEVICE=" + strconv.Itoa(perDevice),
			"NEURON_STANDIN_PLATFORM=" + d.platform,
		},
		"deviceNodes": nodes,
	}
	if d.lockDir != "" {
		edits["mounts"] = []map[string]any{{"hostPath": d.lockDir, "containerPath": standinLockPath, "options": []string{"rbind", "rw"}}}
	}
	spec := map[string]any{
		"cdiVersion": "0.6.0",
		"kind":       cdiKind,
		"devices":    []map[string]any{{"name": string(claim.UID), "containerEdits": edits}},
	}
	data, _ := json.MarshalIndent(spec, "", "  ")
	if err := os.WriteFile(d.cdiFile(claim.UID), data, 0o644); err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	log.Printf("prepared claim %s/%s: devices %v, NEURON_RT_VISIBLE_CORES=%s at LNC %d", claim.Namespace, claim.Name, ids, strings.Join(cores, ","), lnc)
	return result
}

func (d *driver) cdiFile(uid types.UID) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("%s-%s.json", driverName, uid))
}

func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		out[claim.UID] = d.prepare(claim)
	}
	return out, nil
}

func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		err := os.Remove(d.cdiFile(claim.UID))
		if os.IsNotExist(err) {
			err = nil
		}
		out[claim.UID] = err
		log.Printf("unprepared claim %s", claim.UID)
	}
	return out, nil
}

func (d *driver) HandleError(_ context.Context, err error, msg string) {
	log.Printf("%s: %v", msg, err)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the driver's kubeconfig")
	nodeName := flag.String("node-name", "", "the node it runs on")
	kubeletDir := flag.String("kubelet-dir", "/var/lib/kubelet", "the kubelet's --root-dir")
	d := &driver{}
	flag.StringVar(&d.devDir, "dev-dir", "/dev", "where the /dev/neuronN device files are on the host")
	flag.StringVar(&d.lockDir, "lock-dir", "", "the runtime stand-in's core locks, mounted into every container granted devices")
	flag.StringVar(&d.cdiDir, "cdi-dir", "/var/run/cdi", "where containerd reads CDI specs")
	flag.StringVar(&d.instanceType, "instance-type", "trn2.48xlarge", "the node's instance type")
	flag.IntVar(&d.chips, "chips", 16, "Neuron devices on this node")
	flag.IntVar(&d.physicalCores, "physical-cores-per-chip", 8, "physical NeuronCores per device")
	flag.IntVar(&d.defaultLNC, "default-lnc", 2, "the LNC of a claim that sets none (2 on trn2 and trn3, 1 elsewhere)")
	flag.BoolVar(&d.grid, "grid", true, "Trainium's grid topology: publish the connected-device groups")
	flag.Parse()
	d.platform = strings.SplitN(d.instanceType, ".", 2)[0]

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatalf("kubeconfig: %v", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		log.Fatalf("client: %v", err)
	}
	pluginDir := filepath.Join(*kubeletDir, "plugins", driverName)
	for _, dir := range []string{pluginDir, filepath.Join(*kubeletDir, "plugins_registry"), d.cdiDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			log.Fatalf("%s: %v", dir, err)
		}
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(driverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(*nodeName),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(*kubeletDir, "plugins_registry")),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
	)
	if err != nil {
		log.Fatalf("start: %v", err)
	}
	resources := resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{*nodeName: {Slices: []resourceslice.Slice{{Devices: d.devices()}}}},
	}
	if err := helper.PublishResources(ctx, resources); err != nil {
		log.Fatalf("publish: %v", err)
	}
	log.Printf("publishing %d devices of %s for node %s", d.chips, d.instanceType, *nodeName)
	<-ctx.Done()
	helper.Stop()
}
