"""A faithful, fast re-implementation of the WebShop text environment (no JAX).

    from webshop import Catalogue, WebShopEnv, EnvPool, ScriptedExpert
"""

from webshop.actions import parse_action
from webshop.catalogue import Catalogue, Product
from webshop.env import WebShopEnv
from webshop.expert import ScriptedExpert
from webshop.pool import EnvPool
from webshop.reward import purchase_reward

__all__ = ['Catalogue', 'EnvPool', 'Product', 'ScriptedExpert', 'WebShopEnv', 'parse_action', 'purchase_reward']
