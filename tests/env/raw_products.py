"""Hand-built raw products in WebShop's items_shuffle schema, for tests."""


def raw_item(asin: str, name: str, *, pricing='$19.99', options=None, description='A description.',
             bullets=('Bullet one', 'Bullet two'), query='test items', category='fashion',
             product_category='A › B › C') -> dict:
    """One product in WebShop's raw items_shuffle schema."""
    return {
        'asin': asin, 'name': name, 'full_description': description, 'small_description': list(bullets),
        'pricing': pricing, 'images': [f'https://img/{asin}.jpg'], 'category': category, 'query': query,
        'product_category': product_category,
        'customization_options': {k: [{'value': v, 'image': None} for v in vs] for k, vs in (options or {}).items()},
    }


def tiny_raw() -> dict:
    """25 products B0TEST0000..B0TEST0024; the first two carry options and a price range; two instructions."""
    items = [raw_item(f'B0TEST{i:04d}', f'Test Product {i} Shoes') for i in range(25)]
    items[0] = raw_item('B0TEST0000', 'Canvas Running Shoes', pricing='$19.99',
                        options={'Color': ['Black/White', 'Navy Blue'], 'Size': ['8', '9.5 Wide']},
                        description='Comfortable canvas shoes.', bullets=('Rubber sole', 'Lace up', 'Machine wash'))
    items[1] = raw_item('B0TEST0001', 'Leather Walking Shoes', pricing='$25.99$39.99')
    attributes = {
        'B0TEST0000': {'attributes': ['rubber sole', 'lace up'], 'instruction': 'Find me canvas running shoes',
                       'instruction_attributes': ['rubber sole']},
        'B0TEST0001': {'attributes': ['leather'], 'instruction': 'Find me leather walking shoes',
                       'instruction_attributes': ['leather']},
    }
    return {'items': items, 'attributes': attributes, 'human': {}}
