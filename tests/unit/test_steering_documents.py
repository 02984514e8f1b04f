"""The coordinator's steering documents (a profile, a cluster's or circuit's summary, the
listings) are typed on the protocol: read from the store's records as SQLite holds them
(feature ids as decimal strings), crossing the wire equal, and written as JSON in one place
(http/manage/steering_api.document_json) with feature ids as the spec writes them."""

import json

from greenroom.actors import steering_bases as bases
from greenroom.http.manage.steering_api import document_json
from greenroom.protocol import (
    ActiveCircuit,
    Circuits,
    CircuitSummary,
    Clusters,
    Dialled,
    Events,
    Profile,
    Profiles,
    SteeringReply,
)
from greenroom.store.steering import SteeringStore

from .test_protocol import crossed

SAE = {
    "sae_id": "sae",
    "source": "demo:8",
    "layer": 1,
    "hook_point": "blocks.1.hook_resid_post",
    "width": 8,
    "d_in": 16,
    "architecture": "standard",
}
PROFILE = {
    "name": "calm",
    "model": "m",
    "description": "",
    "strengths": {"sae": {"12": 50.0, "3": -20.0}},
    "saes": [SAE],
    "created_at": 1,
    "updated_at": 2,
    "cluster": None,
}
CLUSTER = {
    **PROFILE,
    "name": "warm",
    "description": "Warmth",
    "cluster": {"sae_id": "sae", "intensity": 1.0, "intensity_range": [0.5, 1.5], "labels": {"3": "kind"}},
}
CIRCUIT = {
    "name": "c",
    "model": "m",
    "description": "d",
    "rung": 2,
    "layers": [
        {"layer": 1, "sae_id": "sae", "members": {"7": 10.0, "2": 5.0}, "labels": {"2": "two"}},
        {"layer": 2, "sae_id": None, "members": {"1": 1.0}, "labels": {}},  # unbound: no SAE named
    ],
    "intensity_range": None,
    "slice_fallback": "warm",
    "intensity": 1.0,
    "created_at": 1,
    "updated_at": 2,
}


def _stored(tmp_path) -> SteeringStore:
    """A real store holding the records as every greenroom so far wrote them."""
    store = SteeringStore(str(tmp_path))
    store.put_profile(PROFILE)
    store.put_profile(CLUSTER)
    store.put_circuit(CIRCUIT)
    return store


def test_the_stored_records_read_as_documents_and_answer_as_before(tmp_path):
    store = _stored(tmp_path)
    profile = bases.profile_document(store.profile("calm"))
    assert profile.strengths == {"sae": {12: 50.0, 3: -20.0}}  # ints on the seam
    assert document_json(profile) == {**PROFILE}  # the JSON the route answered from the record
    assert json.dumps(document_json(profile)) == json.dumps(PROFILE)  # keys and order too
    cluster = document_json(bases.profile_document(store.profile("warm")))
    assert cluster == CLUSTER
    assert document_json(bases.cluster_summary(store.profile("warm"), store)) == {
        "name": "warm",
        "model": "m",
        "description": "Warmth",
        "sae_id": "sae",
        "members": [{"feature": 12, "strength": 50.0}, {"feature": 3, "strength": -20.0, "label": "kind"}],
        "intensity": 1.0,
        "intensity_range": [0.5, 1.5],
        "active": False,
        "created_at": 1,
        "updated_at": 2,
    }
    circuit = document_json(bases.circuit_summary(store.circuit("c"), store))
    assert circuit["layers"] == [
        {
            "layer": 1,
            "sae_id": "sae",
            "members": [{"feature": 7, "strength": 10.0}, {"feature": 2, "strength": 5.0, "label": "two"}],
        },
        {"layer": 2, "sae_id": None, "members": [{"feature": 1, "strength": 1.0}]},
    ]
    assert "unparseable" not in circuit and circuit["language"] and circuit["slice_fallback"] == "warm"


def test_an_unparseable_circuit_answers_its_reason_alone(tmp_path):
    store = _stored(tmp_path)
    with store._db() as db:
        db.execute("UPDATE circuits SET definition = ? WHERE name = 'c'", ("[1]",))
    summary = bases.circuit_summary(store.circuit("c"), store)
    assert document_json(summary) == {
        "name": "c",
        "model": "m",
        "active": False,
        "intensity": 1.0,
        "created_at": 1,
        "updated_at": 2,
        "unparseable": "not an object",
    }


def test_each_document_crosses_equal(tmp_path):
    store = _stored(tmp_path)
    profiles = Profiles([bases.profile_document(p) for p in store.profiles()])
    cluster = bases.cluster_summary(store.profile("warm"), store)
    circuit = bases.circuit_summary(store.circuit("c"), store)
    answers = [
        profiles,
        profiles.profiles[0],
        Clusters([cluster]),
        cluster,
        Circuits([circuit, CircuitSummary("x", "m", False, 1.0, 1, 2, unparseable="bad")]),
        circuit,
        Dialled(cluster, None),
        Dialled(circuit, None),
        ActiveCircuit("m", circuit, "circuit", None, None),
    ]
    for answer in answers:
        back = crossed(Events([SteeringReply("c", answer)])).events[0].answer
        assert back == answer and type(back) is type(answer)
    assert (
        type(crossed(Events([SteeringReply("c", Dialled(circuit, None))])).events[0].answer.summary) is CircuitSummary
    )
    assert isinstance(profiles.profiles[1], Profile) and profiles.profiles[1].cluster.labels == {3: "kind"}
