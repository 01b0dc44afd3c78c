"""The slice of RunPod's GraphQL schema that the runpod SDK 1.12 touches for pods and GPU types.

Field names come from the SDK's query texts (runpod/api/queries and mutations);
a query selecting anything else fails here as it would on a strict server, so a
typo in fleetadmin's own queries shows up in tests.
"""

from __future__ import annotations

from runpodsim.graphql import Schema

_POD_FIELDS: dict[str, str | None] = {
    name: None
    for name in (
        "id name containerDiskInGb costPerHr desiredStatus dockerArgs dockerId env gpuCount imageName "
        "lastStatusChange machineId memoryInGb podType port ports uptimeSeconds vcpuCount volumeInGb "
        "volumeMountPath"
    ).split()
} | {"runtime": "PodRuntime", "machine": "PodMachine"}

_GPU_TYPE_FIELDS: dict[str, str | None] = {
    name: None
    for name in (
        "id displayName manufacturer memoryInGb cudaCores maxGpuCount secureCloud communityCloud securePrice "
        "communityPrice oneMonthPrice threeMonthPrice oneWeekPrice communitySpotPrice secureSpotPrice"
    ).split()
} | {"lowestPrice": "LowestPrice"}

_DEPLOY_INPUT: dict[str, str] = {
    "name": "String",
    "imageName": "String",
    "cloudType": "CloudTypeEnum",
    "startSsh": "Boolean",
    "startJupyter": "Boolean",
    "gpuTypeId": "String",
    "supportPublicIp": "Boolean",
    "gpuCount": "Int",
    "volumeInGb": "Int",
    "minVcpuCount": "Int",
    "minMemoryInGb": "Int",
    "allowedCudaVersions": "[String]",
    "dataCenterId": "String",
    "dockerArgs": "String",
    "countryCode": "String",
    "containerDiskInGb": "Int",
    "ports": "String",
    "volumeMountPath": "String",
    "env": "[EnvironmentVariableInput]",
    "templateId": "String",
    "networkVolumeId": "String",
    "containerRegistryAuthId": "String",
    "minDownload": "Int",
    "minUpload": "Int",
}

RUNPOD_SCHEMA = Schema(
    objects={
        "Query": {"gpuTypes": "GpuType", "myself": "User", "pod": "Pod"},
        "Mutation": {
            "podFindAndDeployOnDemand": "Pod",
            "podRentInterruptable": "Pod",
            "podTerminate": None,
            "podStop": "Pod",
            "podResume": "Pod",
        },
        "GpuType": _GPU_TYPE_FIELDS,
        "LowestPrice": {
            "minimumBidPrice": None,
            "uninterruptablePrice": None,
            "minVcpu": None,
            "minMemory": None,
            "stockStatus": None,
        },
        "User": {"id": None, "pods": "Pod"},
        "Pod": _POD_FIELDS,
        "PodRuntime": {"uptimeInSeconds": None, "ports": "PodRuntimePorts"},
        "PodRuntimePorts": {"ip": None, "isIpPublic": None, "privatePort": None, "publicPort": None, "type": None},
        "PodMachine": {"podHostId": None, "gpuDisplayName": None, "gpuTypeId": None, "dataCenterId": None},
    },
    inputs={
        "GpuTypeFilter": {"id": "String", "ids": "[String]"},
        "GpuLowestPriceInput": {"gpuCount": "Int", "secureCloud": "Boolean", "communityCloud": "Boolean"},
        "PodFilter": {"podId": "String!"},
        "PodStopInput": {"podId": "String!", "incrementVersion": "Boolean"},
        "PodResumeInput": {"podId": "String!", "gpuCount": "Int"},
        "PodTerminateInput": {"podId": "String!"},
        "EnvironmentVariableInput": {"key": "String!", "value": "String"},
        "PodFindAndDeployOnDemandInput": _DEPLOY_INPUT,
        # An interruptible pod: the same settings and a bid per GPU ($/h), at least the minimum bid.
        "PodRentInterruptableInput": {**_DEPLOY_INPUT, "bidPerGpu": "Float!"},
    },
    arguments={
        "Query.gpuTypes": {"input": "GpuTypeFilter"},
        "Query.pod": {"input": "PodFilter!"},
        "GpuType.lowestPrice": {"input": "GpuLowestPriceInput"},
        "Mutation.podFindAndDeployOnDemand": {"input": "PodFindAndDeployOnDemandInput!"},
        "Mutation.podRentInterruptable": {"input": "PodRentInterruptableInput!"},
        "Mutation.podTerminate": {"input": "PodTerminateInput!"},
        "Mutation.podStop": {"input": "PodStopInput!"},
        "Mutation.podResume": {"input": "PodResumeInput!"},
    },
    enums={"CloudTypeEnum": frozenset({"ALL", "SECURE", "COMMUNITY"})},
)
